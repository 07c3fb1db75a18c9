"""Gated DeltaNet token mixer of qwen3_5_moe (transformers `Qwen3_5MoeGatedDeltaNet`).

Source: Yang, Kautz, Hatamizadeh, "Gated Delta Networks" (arXiv 2412.06464), as implemented by
transformers 5.23 (`torch_chunk_gated_delta_rule`, `torch_recurrent_gated_delta_rule`).

Per value head, with state S in R^{Dk x Dv}, q/k L2-normalised and q scaled by Dk**-0.5:
    S_t = exp(g_t) S_{t-1} + k_t (beta_t (v_t - S_{t-1}^T k_t exp(g_t)))^T      (decay, then delta rule)
    o_t = S_t^T q_t
Two equal forms (tested against each other):
- `recurrent_gated_delta_rule`: one step per token (`lax.scan`), used for one-token decoding.
- `chunk_gated_delta_rule`: chunks of C tokens; inside a chunk the delta-rule updates are condensed by
  the UT transform (the inverse of a unit lower-triangular matrix, by recursive block inversion), across
  chunks a `lax.scan` carries S. Used for training and prefill. C = 64 (transformers' and FLA's choice)
  when compiling for an accelerator, 16 for the CPU (`default_chunk_size`; why: docs/tuning.md). For an
  accelerator the chunks also go in checkpointed groups of about sqrt(N) (`default_group`): the backward
  pass then holds one group's fp32 intermediates, not all N chunks' (docs/real_scale.md).
Everything inside the kernels is float32 (the checkpoint's `mamba_ssm_dtype`).

Packed rows (`hat_jax.model.segments`): an optional `reset` [B, T] marks each document's first token, where
the decay is zero (S_{t-1} is dropped: S_t = k_t (beta_t v_t)^T), so no state crosses documents, as fla's
varlen kernels do with `cu_seqlens` (flash-linear-attention `chunk_gated_delta_rule`). fla starts a new
chunk at each sequence; here chunks stay fixed and every decay product in a chunk is zeroed when a reset
lies between its two ends (`chunk_gated_delta_rule`), so documents may cross chunk boundaries. The conv
masks the taps that reach into an earlier segment.

Layer: in_proj_qkv -> causal depthwise conv1d (kernel 4, no bias) + SiLU -> split q [Hk], k [Hk], v [Hv]
heads; beta = sigmoid(in_proj_b x); g = -exp(A_log) * softplus(in_proj_a x + dt_bias) (log-decay <= 0);
value head j reads key head j // (Hv / Hk) (repeat-interleave, not tile); gated RMSNorm with
z = in_proj_z x; out_proj. Padding positions are zeroed at the input, as transformers does.

Under a mesh with a 'context' axis (context parallelism, `hat_jax.model.context_parallel`) the uncached
forward runs the conv on each sequence shard with the previous shard's last K-1 inputs as its state and the
recurrence as `context_parallel_delta_rule`.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from hat_jax.model.config import Qwen3_5MoeTextConfig
from hat_jax.model.context_parallel import (CONTEXT_AXIS, check_sequence_split, context_size, from_previous_shard,
                                            is_first_shard, map_sequence_shards)
from hat_jax.model.linear import Linear
from hat_jax.model.norms import GatedRMSNorm
from hat_jax.model.segments import segment_starts
from hat_jax.model.sharding import param_with_axes, target_platform

CHUNK_SIZE = 64
CPU_CHUNK_SIZE = 16  # faster than 64 on the CPU at the tiny preset's shapes (docs/tuning.md)


def default_chunk_size() -> int:
    """The chunk size `GatedDeltaNet` uses: CPU_CHUNK_SIZE when compiling for the CPU, else CHUNK_SIZE (the
    platform of the mesh in context, `target_platform`: an AOT compile for TPU from a CPU host gets 64). Any
    power of two gives the same result up to float rounding."""
    return CPU_CHUNK_SIZE if target_platform() == "cpu" else CHUNK_SIZE


def l2_normalize(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    """`x * rsqrt(sum(x^2) + eps)` over the last axis (the FLA / transformers `l2norm`)."""
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def recurrent_gated_delta_rule(q, k, v, g, beta, initial_state, reset=None, all_states: bool = False):
    """Token-by-token gated delta rule.

    Args:
        q, k: [B, T, H, Dk] float32, already L2-normalised, q already scaled.
        v: [B, T, H, Dv] float32. g, beta: [B, T, H] float32 (log-decay <= 0, write strength in (0, 1)).
        initial_state: [B, H, Dk, Dv] float32.
        reset: optional [B, T] bool: at True the decay is zero (the state before the token is dropped).
        all_states: return the state after every token, [B, T, H, Dk, Dv], instead of the final one.
    Returns:
        (o [B, T, H, Dv] float32, final state [B, H, Dk, Dv] float32 (or all states)).
    """

    def step(state, xs):
        q_t, k_t, v_t, g_t, b_t = xs[:5]  # [B,H,Dk], [B,H,Dk], [B,H,Dv], [B,H], [B,H]; xs[5]: reset [B]
        state = state * jnp.exp(g_t)[..., None, None]
        if reset is not None:
            state = jnp.where(xs[5][:, None, None, None], 0.0, state)
        kv_mem = jnp.einsum("bhkv,bhk->bhv", state, k_t)
        delta = (v_t - kv_mem) * b_t[..., None]
        state = state + k_t[..., :, None] * delta[..., None, :]
        out = jnp.einsum("bhkv,bhk->bhv", state, q_t)
        return state, (out, state) if all_states else out

    xs = tuple(jnp.moveaxis(a, 1, 0) for a in (q, k, v, g, beta) + (() if reset is None else (reset,)))
    state, out = jax.lax.scan(step, initial_state, xs)
    if all_states:
        out, states = out
        return jnp.moveaxis(out, 0, 1), jnp.moveaxis(states, 0, 1)
    return jnp.moveaxis(out, 0, 1), state


@jax.custom_vjp
def unit_lower_triangular_inverse(strict_lower: jax.Array) -> jax.Array:
    """Inverse of I + L for strictly lower-triangular L, by recursive 2x2 block inversion.

    [[A, 0], [C, D]]^-1 = [[A^-1, 0], [-D^-1 C A^-1, D^-1]], applied bottom-up from 1x1 blocks: only batched
    matmuls (no LAPACK call), the same numerics as blocked forward substitution (LAPACK `trtri`'s recursive
    variant). It replaces `triangular_solve` on CPU, where two concurrent batched LAPACK solves in one XLA
    program were seen to deadlock the intra-op thread pool (jaxlib 0.10.2).

    The backward pass is the closed form d/dL of X = (I + L)^-1: grad_L = strict_lower(-X^T G X^T) (a
    custom VJP: three times faster on CPU than differentiating through the recursion).

    Args:
        strict_lower: [..., C, C], C a power of two; entries on and above the diagonal are ignored.
    Returns:
        [..., C, C] the unit lower-triangular inverse of (I + strict_lower).
    """
    return _block_inverse(strict_lower)


def _block_inverse(strict_lower: jax.Array) -> jax.Array:
    c = strict_lower.shape[-1]
    if c & (c - 1):
        raise ValueError(f"unit_lower_triangular_inverse: size {c} is not a power of two")
    batch = strict_lower.shape[:-2]
    lower = jnp.tril(strict_lower, -1)
    inv = jnp.ones(batch + (c, 1, 1), strict_lower.dtype)       # inverses of the 1x1 diagonal blocks
    s = 1
    while s < c:
        n = c // (2 * s)
        # lower-left s x s block of each 2s x 2s diagonal block of L: rows [2s i + s, 2s i + 2s), cols [2s i, 2s i + s)
        blocks = lower.reshape(batch + (n, 2 * s, n, 2 * s))
        blocks = jnp.diagonal(blocks, axis1=-4, axis2=-2)           # [..., 2s, 2s, n]
        cm = jnp.moveaxis(blocks, -1, -3)[..., s:, :s]              # [..., n, s, s]
        a_inv, d_inv = inv[..., 0::2, :, :], inv[..., 1::2, :, :]
        off = -jnp.einsum("...ij,...jk,...kl->...il", d_inv, cm, a_inv)
        top = jnp.concatenate([a_inv, jnp.zeros_like(a_inv)], axis=-1)
        bottom = jnp.concatenate([off, d_inv], axis=-1)
        inv = jnp.concatenate([top, bottom], axis=-2)              # [..., n, 2s, 2s]
        s *= 2
    return inv[..., 0, :, :]


def _inverse_fwd(strict_lower):
    x = _block_inverse(strict_lower)
    return x, x


def _inverse_bwd(x, g):
    return (jnp.tril(-jnp.einsum("...ji,...jk,...lk->...il", x, g, x), -1),)


unit_lower_triangular_inverse.defvjp(_inverse_fwd, _inverse_bwd)


def chunk_gated_delta_rule(q, k, v, g, beta, initial_state, chunk_size: int = CHUNK_SIZE, reset=None,
                           group: int | None = None):
    """Chunked gated delta rule; same arguments and results as `recurrent_gated_delta_rule`.

    T is zero-padded to a multiple of `chunk_size` (g = 0, beta = 0 on padding, so the state is unchanged).
    In a chunk with log-decay cumsum c, token i reads the incoming state S_0 decayed by exp(c_i), token j's
    write reaches token i >= j decayed by exp(c_i - c_j). With `reset`, let r be the per-chunk inclusive
    cumsum of resets: the first factor is zero unless r_i = 0 and the second unless r_i = r_j (no reset in
    (j, i]); this is exact for documents that cross chunk boundaries, and `reset=None` skips it.

    group: None, or a number of chunks G: the chunks are processed G at a time by an outer `lax.scan` whose
    body (the intra-chunk work and the state scan of G chunks) is `jax.checkpoint`ed, so the backward pass
    keeps one state per group and recomputes a group's fp32 intermediates when it needs them: those exist
    for G chunks at a time instead of all N (the number of chunks is padded to a multiple of G). The same
    math; the backward pass recomputes the forward once more. `default_group` picks G for a sequence.
    """
    b, t, h, dk = k.shape
    if group is not None and group < 1:
        raise ValueError(f"chunk_gated_delta_rule: group = {group}: expected None or a positive number of chunks")
    g_size = group or 1
    pad = (-t) % (chunk_size * g_size)
    pad_time = lambda a: jnp.pad(a, [(0, 0), (0, pad)] + [(0, 0)] * (a.ndim - 2))
    n = (t + pad) // chunk_size
    # -> [B, H, N, C, ...]
    to_chunks = lambda a: jnp.moveaxis(a, 2, 1).reshape(b, h, n, chunk_size, *a.shape[3:])
    chunks = tuple(map(to_chunks, map(pad_time, (q, k, v, g, beta))))
    if reset is not None:   # per-chunk inclusive cumsum of the resets, [B, 1, N, C]
        chunks += (jnp.cumsum(pad_time(reset).astype(jnp.int32).reshape(b, 1, n, chunk_size), axis=-1),)
    if group is None:
        state, out = _chunk_scan(initial_state, chunks)                  # out [N,B,H,C,Dv]
    else:   # [B, H, N, ...] -> [N/G, B, H, G, ...]
        grouped = tuple(jnp.moveaxis(a.reshape(a.shape[:2] + (n // group, group) + a.shape[3:]), 2, 0)
                        for a in chunks)
        state, out = jax.lax.scan(jax.checkpoint(_chunk_scan), initial_state, grouped)   # [N/G,G,B,H,C,Dv]
        out = out.reshape((n,) + out.shape[2:])
    out = jnp.moveaxis(out, 0, 2).reshape(b, h, n * chunk_size, -1)[:, :, :t]
    return jnp.moveaxis(out, 1, 2), state


def default_group(num_chunks: int) -> int | None:
    """The `group` of `chunk_gated_delta_rule` that `GatedDeltaNet` uses for `num_chunks` chunks: None (no
    recomputation) when compiling for the CPU or for fewer than 16 chunks, else the power of two nearest
    sqrt(num_chunks) (N/G + G states kept instead of N: 32 instead of 256 at 16,384 tokens in chunks of 64)."""
    if target_platform() == "cpu" or num_chunks < 16:
        return None
    return 1 << round(0.5 * (num_chunks.bit_length() - 1))


def context_parallel_delta_rule(q, k, v, g, beta, reset=None, chunk_size: int = CHUNK_SIZE):
    """`chunk_gated_delta_rule` from a zero state with the sequence split over the 'context' axis (P shards).

    Each shard runs the chunked rule on its own tokens P times (P passes), pass r from the final state the
    previous shard reached in pass r - 1 (`from_previous_shard`; shard 0 always from zeros). Shard i's start
    state is exact from pass i + 1 on, by induction, so pass P's outputs are exact everywhere. The rule is
    linear in its start state, so a cheaper correction exists; P passes keep the kernel as it is, at P times
    the recurrence's FLOPs (not of the projections around it). Each pass checkpoints its chunk groups
    (`default_group` of the shard's chunks).

    Args:
        q, k, v, g, beta, reset: as `chunk_gated_delta_rule` ([B, T, ...], T split by the 'context' axis).
        chunk_size: tokens per chunk.
    Returns:
        o [B, T, H, Dv] float32 (the final state is not returned: nothing uncached needs it).
    Raises:
        ValueError from `check_sequence_split`.
    """
    _, _, h, dk = k.shape
    dv = v.shape[-1]

    def body(q, k, v, g, beta, *rest):
        p = jax.lax.axis_size(CONTEXT_AXIS)
        reset_local = rest[0] if rest else None
        group = default_group(-(-q.shape[1] // chunk_size))
        state = jnp.zeros((q.shape[0], h, dk, dv), jnp.float32)
        for r in range(p):
            o, end = chunk_gated_delta_rule(q, k, v, g, beta, state, chunk_size, reset_local, group)
            if r + 1 < p:
                state = from_previous_shard(end)
        return o

    seq = (q, k, v, g, beta) + (() if reset is None else (reset,))
    return map_sequence_shards(body, seq)


def _chunk_scan(state, chunks):
    """The intra-chunk (UT transform) work of `chunk_gated_delta_rule` for the chunks [B, H, N, C, ...] of
    `chunks` = (q, k, v, g, beta[, reset cumsum]), then the scan over them from `state` [B, H, Dk, Dv];
    returns (final state, out [N, B, H, C, Dv])."""
    q, k, v, g, beta = chunks[:5]
    chunk_size = q.shape[3]
    k_beta, v_beta = k * beta[..., None], v * beta[..., None]
    cum = jnp.cumsum(g, axis=-1)                                         # [B,H,N,C]
    causal = jnp.tril(jnp.ones((chunk_size, chunk_size), bool))
    if len(chunks) == 5:
        connected = causal
        from_state = jnp.exp(cum)                                        # decay from S_0 to token i
        to_end = jnp.exp(cum[..., -1:] - cum)                            # decay from token j to the chunk end
    else:
        resets = chunks[5]
        connected = causal & (resets[..., :, None] == resets[..., None, :])             # [B,1,N,C,C]
        from_state = jnp.where(resets == 0, jnp.exp(cum), 0.0)
        to_end = jnp.where(resets == resets[..., -1:], jnp.exp(cum[..., -1:] - cum), 0.0)
    pair = jnp.exp(jnp.where(connected, cum[..., :, None] - cum[..., None, :], -jnp.inf))
    ut = jnp.einsum("bhnik,bhnjk->bhnij", k_beta, k) * pair
    intra = jnp.einsum("bhnik,bhnjk->bhnij", q, k) * pair
    ut_inv = unit_lower_triangular_inverse(ut)                           # (I + strict_lower(ut))^-1
    new_values = jnp.einsum("bhnij,bhnjd->bhnid", ut_inv, v_beta)        # [B,H,N,C,Dv]
    k_cumdecay = jnp.einsum("bhnij,bhnjd->bhnid", ut_inv, k_beta * from_state[..., None])  # [B,H,N,C,Dk]
    q = q * from_state[..., None]
    k = k * to_end[..., None]
    chunk_decay = from_state[..., -1][..., None, None]                   # [B,H,N,1,1]

    def step(state, xs):
        q_i, k_i, nv_i, kc_i, intra_i, decay_i = xs
        v_new = nv_i - jnp.einsum("bhck,bhkv->bhcv", kc_i, state)
        out = jnp.einsum("bhck,bhkv->bhcv", q_i, state) + jnp.einsum("bhcj,bhjv->bhcv", intra_i, v_new)
        state = state * decay_i + jnp.einsum("bhck,bhcv->bhkv", k_i, v_new)
        return state, out

    xs = tuple(jnp.moveaxis(a, 2, 0) for a in (q, k, new_values, k_cumdecay, intra, chunk_decay))
    return jax.lax.scan(step, state, xs)


def causal_depthwise_conv(x: jax.Array, kernel: jax.Array, state: jax.Array,
                          segment_ids: jax.Array | None = None,
                          state_segment_ids: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """Causal depthwise conv1d over time, continuing from `state`.

    Args:
        x: [B, T, C]; kernel: [K, C] (kernel[j, c] = HF conv1d.weight[c, 0, j]); state: [B, K-1, C], the
            previous K-1 inputs (zeros at the start of a sequence).
        segment_ids: optional [B, T] int: tap x[t - s] counts only when segment_ids[t - s] == segment_ids[t]
            (a packed document sees only its own tokens); the state's inputs then count only where
            `state_segment_ids` [B, K-1] matches (without it they never do: the state is ignored).
    Returns:
        (y [B, T, C] with y[t] = sum_j kernel[j] * x[t - K + 1 + j], new state [B, K-1, C]).
    """
    kk = kernel.shape[0]
    xs = jnp.concatenate([state.astype(x.dtype), x], axis=1)
    t = x.shape[1]
    if segment_ids is None:
        y = sum(xs[:, j:j + t] * kernel[j] for j in range(kk))
    else:
        if state_segment_ids is None:
            seg = jnp.pad(segment_ids, ((0, 0), (kk - 1, 0)), constant_values=-1)
        else:
            seg = jnp.concatenate([state_segment_ids.astype(segment_ids.dtype), segment_ids], axis=1)
        same = lambda j: (seg[:, j:j + t] == segment_ids)[..., None]
        y = sum(jnp.where(same(j), xs[:, j:j + t], 0) * kernel[j] for j in range(kk))
    return y, xs[:, xs.shape[1] - (kk - 1):]


def context_parallel_conv(x: jax.Array, kernel: jax.Array, segment_ids: jax.Array | None = None) -> jax.Array:
    """`causal_depthwise_conv` of a whole sequence (zero state) with the sequence split over the 'context'
    axis: each shard's state is the previous shard's last K-1 inputs (and their segment ids), shard 0's zeros.

    Args:
        x: [B, T, C]; kernel: [K, C]; segment_ids: optional [B, T] int32 of packed rows.
    Returns:
        y [B, T, C], equal to `causal_depthwise_conv(x, kernel, zeros, segment_ids)[0]`.
    Raises:
        ValueError: a shard would hold fewer than K-1 tokens (`check_sequence_split`).
    """
    kk = kernel.shape[0]
    check_sequence_split(x.shape[1], "the Gated DeltaNet conv", kk - 1)

    def body(x, *rest):
        *seg, w = rest
        halo = from_previous_shard(x[:, x.shape[1] - (kk - 1):])
        if not seg:
            return causal_depthwise_conv(x, w, halo)[0]
        ids = seg[0]
        halo_ids = jnp.where(is_first_shard(), -1, from_previous_shard(ids[:, ids.shape[1] - (kk - 1):]))
        return causal_depthwise_conv(x, w, halo, ids, halo_ids)[0]

    seq = (x,) if segment_ids is None else (x, segment_ids)
    return map_sequence_shards(body, seq, (kernel,))


def conv_windows(state: jax.Array, x: jax.Array, kernel_size: int) -> jax.Array:
    """The conv state after each of the T tokens of `x`: [B, T, K-1, C] from state [B, K-1, C] and x [B, T, C]
    (entry t equals the state `causal_depthwise_conv` returns for x[:, :t + 1])."""
    xs = jnp.concatenate([state.astype(x.dtype), x], axis=1)
    return jnp.stack([xs[:, t + 1:t + kernel_size] for t in range(x.shape[1])], axis=1)


def _a_log_init(key, shape, dtype):
    """A ~ U(0.01, 16), stored as log A (transformers `_init_weights`)."""
    return jnp.log(jax.random.uniform(key, shape, jnp.float32, 0.01, 16.0)).astype(dtype)


DT_MIN, DT_MAX, DT_FLOOR = 1e-3, 1e-1, 1e-4
# From-scratch init std of out_proj: 0, the branch starts as the identity (`hat_jax.model.params.init_params`).
OUT_PROJ_INIT_STD = 0.0


def _dt_bias_init(key, shape, dtype):
    """dt_bias = softplus^-1(dt) with dt ~ logU(DT_MIN, DT_MAX) floored at DT_FLOOR: the from-scratch init of
    the Gated DeltaNet authors' layer (fla-org/flash-linear-attention `fla/layers/gated_deltanet.py`, as Mamba-2's).

    The per-token log-decay is g = -A * softplus(a_t + dt_bias); with A ~ U(0.01, 16) this gives memories from
    about one token to thousands. transformers' `_init_weights` fills dt_bias with 1 (softplus 1.31), a placeholder
    before pretrained weights are loaded: from scratch it makes most heads forget within a token
    (exp(-8 * 1.31) per step at A = 8), and a tiny model trained for minutes never learns to read its context.
    """
    u = jax.random.uniform(key, shape, jnp.float32)
    dt = jnp.maximum(jnp.exp(u * (jnp.log(DT_MAX) - jnp.log(DT_MIN)) + jnp.log(DT_MIN)), DT_FLOOR)
    return (dt + jnp.log(-jnp.expm1(-dt))).astype(dtype)


class CausalConv1d(nn.Module):
    """Holds the depthwise conv kernel [K, conv_dim]; init U(-1/sqrt(K), 1/sqrt(K)) as torch's Conv1d."""

    kernel_size: int
    channels: int
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self):
        bound = self.kernel_size**-0.5
        init = lambda key, shape, dtype: jax.random.uniform(key, shape, dtype, -bound, bound)
        return param_with_axes(self, "kernel", init, (self.kernel_size, self.channels), self.param_dtype,
                               ("conv_kernel", "linear_qkv"))


class GatedDeltaNet(nn.Module):
    """Params: in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, conv1d.kernel [K, C], A_log [Hv], dt_bias [Hv],
    norm.weight [Dv], out_proj. `cache_steps`: a cached call runs the recurrent form and returns the cache
    after every token (conv [B, T, K-1, conv_dim], state [B, T, Hv, Dk, Dv]; speculative verification picks
    the accepted one)."""

    config: Qwen3_5MoeTextConfig
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    cache_steps: bool = False

    @nn.compact
    def __call__(self, x, token_mask=None, cache=None, segment_ids=None):
        """
        Args:
            x: [B, T, hidden]. token_mask: [B, T] bool or None (False = padding, zeroed at the input).
            cache: None or {'conv': [B, K-1, conv_dim], 'state': [B, Hv, Dk, Dv] float32}.
            segment_ids: optional [B, T] int32 of packed documents (`hat_jax.model.segments`): the recurrence
                restarts at each document's first token and the conv sees only its own document. Not with
                a cache.
        Returns:
            (y [B, T, hidden], new cache or None). With a cache and T == 1 the recurrent form runs,
            otherwise the chunked form (from the cached state when there is one).
        Raises:
            ValueError when both `cache` and `segment_ids` are given.
        """
        if cache is not None and segment_ids is not None:
            raise ValueError("GatedDeltaNet: segment_ids with a cache is not supported (a cache row holds one "
                             "sequence); expected segment_ids=None")
        c = self.config
        b, t, _ = x.shape
        hk, hv, dk, dv = c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim
        kk = c.linear_conv_kernel_dim
        if token_mask is not None:
            x = x * token_mask[..., None].astype(x.dtype)
        dense = lambda n, feats, axes: Linear(feats, axes, self.dtype, self.param_dtype, c.initializer_range, name=n)
        qkv = dense("in_proj_qkv", c.linear_conv_dim, ("embed", "linear_qkv"))(x)
        z = dense("in_proj_z", c.linear_value_dim, ("embed", "linear_v"))(x).reshape(b, t, hv, dv)
        beta_logits = dense("in_proj_b", hv, ("embed", "linear_heads"))(x)
        a = dense("in_proj_a", hv, ("embed", "linear_heads"))(x)

        conv_kernel = CausalConv1d(kk, c.linear_conv_dim, self.param_dtype, name="conv1d")()
        a_log = param_with_axes(self, "A_log", _a_log_init, (hv,), self.param_dtype, ("linear_heads",))
        dt_bias = param_with_axes(self, "dt_bias", _dt_bias_init, (hv,), self.param_dtype, ("linear_heads",))

        conv_state = cache["conv"] if cache is not None else jnp.zeros((b, kk - 1, c.linear_conv_dim), self.dtype)
        qkv_in = qkv
        context_parallel = cache is None and context_size() > 1
        if context_parallel:
            qkv = context_parallel_conv(qkv, conv_kernel.astype(self.dtype), segment_ids)
        else:
            qkv, new_conv_state = causal_depthwise_conv(qkv, conv_kernel.astype(self.dtype), conv_state, segment_ids)
        qkv = jax.nn.silu(qkv)
        q, k, v = jnp.split(qkv, [c.linear_key_dim, 2 * c.linear_key_dim], axis=-1)
        ratio = hv // hk
        q = jnp.repeat(q.reshape(b, t, hk, dk), ratio, axis=2).astype(jnp.float32)
        k = jnp.repeat(k.reshape(b, t, hk, dk), ratio, axis=2).astype(jnp.float32)
        v = v.reshape(b, t, hv, dv).astype(jnp.float32)
        beta = jax.nn.sigmoid(beta_logits).astype(jnp.float32)
        g = -jnp.exp(a_log.astype(jnp.float32)) * jax.nn.softplus(a.astype(jnp.float32) + dt_bias.astype(jnp.float32))
        q = l2_normalize(q) * dk**-0.5
        k = l2_normalize(k)
        state0 = cache["state"] if cache is not None else jnp.zeros((b, hv, dk, dv), jnp.float32)
        reset = None if segment_ids is None else segment_starts(segment_ids)
        if cache is not None and self.cache_steps:
            o, state = recurrent_gated_delta_rule(q, k, v, g, beta, state0, all_states=True)
            new_conv_state = conv_windows(conv_state, qkv_in, kk)
        elif cache is not None and t == 1:
            o, state = recurrent_gated_delta_rule(q, k, v, g, beta, state0)
        elif context_parallel:
            o = context_parallel_delta_rule(q, k, v, g, beta, reset, default_chunk_size())
        else:
            chunk = default_chunk_size()
            o, state = chunk_gated_delta_rule(q, k, v, g, beta, state0, chunk, reset, default_group(-(-t // chunk)))
        o = GatedRMSNorm(c.rms_norm_eps, self.param_dtype, name="norm")(o.astype(self.dtype), z)
        # Zero-initialised (OUT_PROJ_INIT_STD): the residual branch starts as the identity (`params.INIT_SCHEME`).
        y = Linear(c.hidden_size, ("linear_v", "embed"), self.dtype, self.param_dtype, OUT_PROJ_INIT_STD,
                   name="out_proj")(o.reshape(b, t, hv * dv))
        new_cache = None if cache is None else {"conv": new_conv_state.astype(cache["conv"].dtype), "state": state}
        return y, new_cache
