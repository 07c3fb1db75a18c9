"""Sparse MoE block of qwen3_5_moe (transformers `Qwen3_5MoeSparseMoeBlock`), dropless, and its losses.

Router (`Qwen3_5MoeTopKRouter`): logits = x W_g (compute dtype); p = softmax(logits) in float32; top-k;
weights always renormalised to sum to 1 over the k chosen experts, then cast to the compute dtype.
Experts: SwiGLU `down(silu(gate x) * up x)`, with gate/up fused as `gate_up_proj` [E, H, 2I] (gate
first). Shared expert: a SwiGLU MLP scaled by `sigmoid(shared_expert_gate x)`, added to every token.

Dispatch (`moe_impl`, `MOE_IMPLS`) is dropless and its compute is proportional to the *active* experts:
- `blocked` (default): assignments are sorted by expert and each expert's group is padded to a multiple
  of a block size chosen at trace time (`_block_size`); each block is one expert, so the grouped matmul is
  one gather of the block's expert weights plus a batched matmul (MegaBlocks-style block-sparse, Gale et
  al. 2022, written as gather + einsum), and decoding (few tokens) gathers only the experts it uses. Rows
  enter and leave the layout by gathers in both passes (`take_rows`): no row scatter, which XLA:CPU runs
  as a serial loop.
- `ragged_dot`: the same sorted layout through `jax.lax.ragged_dot` (native grouped GEMM on TPU/GPU;
  on CPU it lowers to a loop over all experts and is slow, see experiments/benchmarks/model_bench.py).
- `megablox`: the same layout through jax's Pallas TPU grouped matmul (`megablox.gmm`/`tgmm`), the TPU
  choice: its backward stays proportional to the active experts.
- `dense`: every expert on every token, then the chosen k gathered (compute not proportional to the
  active experts; a reference and an option for few experts and few tokens, not faster on CPU here).
- `ep_ragged_dot`, `ep_megablox`: expert parallelism (`hat_jax.model.expert_parallel`) under a mesh with an
  'expert' axis > 1; without one, the token-local `ragged_dot` / `megablox`.
The `EXPERT_IMPLS` (the first four) are token-local (`token_local_experts`: each device's own rows against all
experts' weights, all-gathered). `moe_token_chunk` runs any of them on chunks of each device's rows in a
rematerialised scan, same result in smaller buffers (`routed_experts`).

Routing replay (R3, for RL): `forced_expert_ids` replaces the top-k choice while the weights still come
from the live router probabilities at those ids (renormalised).

Losses (pure functions): `load_balancing_loss` is transformers' `load_balancing_loss_func` (Switch Transformer
eqs. 4-6 with top-k counts, Fedus et al. 2021), `router_z_loss` is ST-MoE's z-loss (Zoph et al. 2022, eq. 5).
"""

from __future__ import annotations

from functools import partial

import flax.linen as nn
import jax
import jax.numpy as jnp

from hat_jax.model.config import Qwen3_5MoeTextConfig
from hat_jax.model.expert_parallel import check_expert_axis, expert_parallel_ffn
from hat_jax.model.expert_sort import scan_row_chunks, sorted_assignments, take_rows
from hat_jax.model.linear import Linear
from hat_jax.model.router_stats import load_balancing_loss_from_stats, router_stats, router_z_loss_from_stats
from hat_jax.model.sharding import active_mesh_shape, constrain, map_row_shards, param_with_axes, target_platform


def route(logits: jax.Array, top_k: int, forced_expert_ids: jax.Array | None = None):
    """Top-k softmax routing with renormalised weights.

    Args:
        logits: [N, E] router logits (any float dtype).
        top_k: experts per token.
        forced_expert_ids: optional [N, k] int32 expert ids to use instead of the top-k (routing replay).
    Returns:
        (weights [N, k] float32 summing to 1 per row, expert_ids [N, k] int32).
    """
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    if forced_expert_ids is None:
        top, ids = jax.lax.top_k(probs, top_k)
    else:
        ids = forced_expert_ids.astype(jnp.int32)
        top = jnp.take_along_axis(probs, ids, axis=-1)
    return top / jnp.sum(top, axis=-1, keepdims=True), ids.astype(jnp.int32)


def _block_size(num_assignments: int, num_experts: int) -> int:
    """Largest power of two <= the mean tokens per expert and <= a cap: 128, raised up to 512 while that
    stays under a quarter of the mean (padding <= E * (bk - 1) rows); fewer, larger blocks gather fewer
    expert weights (about 13% faster MoE forward at 16 x 1400 tokens of the tiny preset on CPU)."""
    per_expert = max(1, num_assignments // num_experts)
    cap = max(128, min(512, per_expert // 4))
    bk = 1
    while bk * 2 <= min(per_expert, cap):
        bk *= 2
    return bk


def blocked_layout(expert_ids: jax.Array, num_experts: int):
    """Where each (token, slot) assignment goes in the block-padded expert-sorted layout of `blocked_expert_ffn`.

    Assignments are stably sorted by expert; each expert's group starts a new block of `bk` rows
    (`_block_size`) and is padded up to a multiple of it, so every block holds one expert's rows.

    Args:
        expert_ids: [N, k] int32 in [0, E). num_experts: E.
    Returns:
        (bk, slot_of_assignment [N*k] int32 (row in the padded layout of assignment n*k + j),
        assignment_of_slot [B*bk] int32 (its assignment, N*k for a padding row),
        block_expert [B] int32 (the expert of each block; padding blocks at the end take E - 1)).
    """
    n, k = expert_ids.shape
    m = n * k
    bk = _block_size(m, num_experts)
    num_blocks = -(-(m + num_experts * (bk - 1)) // bk)
    flat = expert_ids.reshape(m)
    order = jnp.argsort(flat, stable=True).astype(jnp.int32)                  # sorted position -> assignment
    sorted_e = flat[order]
    sizes = jnp.bincount(flat, length=num_experts)
    starts = jnp.cumsum(sizes) - sizes
    padded = (sizes + bk - 1) // bk * bk
    padded_starts = jnp.cumsum(padded) - padded
    dest = (padded_starts[sorted_e] + jnp.arange(m) - starts[sorted_e]).astype(jnp.int32)  # sorted position -> row
    slot_of_assignment = jnp.zeros(m, jnp.int32).at[order].set(dest)
    assignment_of_slot = jnp.full(num_blocks * bk, m, jnp.int32).at[dest].set(order)
    block_expert = jnp.searchsorted(jnp.cumsum(padded), jnp.arange(num_blocks) * bk, side="right")
    return bk, slot_of_assignment, assignment_of_slot, jnp.minimum(block_expert, num_experts - 1).astype(jnp.int32)


def blocked_expert_ffn(x: jax.Array, expert_ids: jax.Array, gate_up: jax.Array, down: jax.Array) -> jax.Array:
    """SwiGLU experts on sorted, block-padded assignments (`blocked_layout`). Rows move in and out of the
    layout by `take_rows` (gathers both ways, forward and backward; only [N*k] int32 index maps are
    scattered), each block's expert weights are gathered, and the grouped matmul is a batched matmul.

    Args:
        x: [N, H] tokens (compute dtype). expert_ids: [N, k] int32.
        gate_up: [E, H, 2I] (gate columns first). down: [E, I, H].
    Returns:
        [N, k, H]: expert output for each (token, slot), unweighted.
    """
    n, k = expert_ids.shape
    bk, slot_of_assignment, assignment_of_slot, block_expert = blocked_layout(expert_ids, gate_up.shape[0])
    rows = take_rows(jnp.repeat(x, k, axis=0), assignment_of_slot, slot_of_assignment)
    rows = rows.reshape(-1, bk, x.shape[-1])                                  # [B, bk, H], one expert per block
    h = jnp.einsum("bth,bhf->btf", rows, gate_up[block_expert].astype(x.dtype))
    g, u = jnp.split(h, 2, axis=-1)
    y = jnp.einsum("btf,bfh->bth", jax.nn.silu(g) * u, down[block_expert].astype(x.dtype))
    y = take_rows(y.reshape(rows.shape[0] * bk, -1), slot_of_assignment, assignment_of_slot)
    return y.reshape(n, k, -1)


def ragged_grouped_ffn(rows: jax.Array, sizes: jax.Array, gate_up: jax.Array, down: jax.Array) -> jax.Array:
    """SwiGLU experts on expert-sorted rows via `jax.lax.ragged_dot`.

    Args:
        rows: [M, H] sorted by expert (compute dtype). sizes: [E] int32 rows per expert (sum <= M; rows past
        the sum belong to no expert and come out as zeros). gate_up: [E, H, 2I]. down: [E, I, H].
    Returns:
        [M, H] in the rows' order.
    """
    h = jax.lax.ragged_dot(rows, gate_up.astype(rows.dtype), sizes)
    g, u = jnp.split(h, 2, axis=-1)
    return jax.lax.ragged_dot(jax.nn.silu(g) * u, down.astype(rows.dtype), sizes)


def ragged_expert_ffn(x: jax.Array, expert_ids: jax.Array, gate_up: jax.Array, down: jax.Array) -> jax.Array:
    """Same contract as `blocked_expert_ffn`, via `jax.lax.ragged_dot` on expert-sorted rows."""
    e = gate_up.shape[0]
    rows, flat, unsort = sorted_assignments(x, expert_ids)
    sizes = jnp.bincount(flat, length=e).astype(jnp.int32)
    return unsort(ragged_grouped_ffn(rows, sizes, gate_up, down))


MEGABLOX_TILING = (128, 128, 128)  # (rows, contraction, output) tile; megablox's default, untuned (no TPU here)


def megablox_grouped_ffn(rows: jax.Array, sizes: jax.Array, gate_up: jax.Array, down: jax.Array) -> jax.Array:
    """SwiGLU experts on expert-sorted rows via megablox `gmm` (see `megablox_expert_ffn`). Only the row tiles
    that hold a group are computed, so rows past sum(sizes) are left undefined: the caller masks them.

    Args:
        rows: [M, H] sorted by expert, M a multiple of MEGABLOX_TILING[0]. sizes: [E] int32 (sum <= M).
        gate_up: [E, H, 2I]. down: [E, I, H].
    Returns:
        [M, H] in the rows' order.
    """
    from jax.experimental.pallas.ops.tpu.megablox import gmm

    kw = dict(preferred_element_type=rows.dtype, tiling=MEGABLOX_TILING, interpret=target_platform() != "tpu")
    h = gmm(rows, gate_up.astype(rows.dtype), sizes, **kw)
    g, u = jnp.split(h, 2, axis=-1)
    return gmm(jax.nn.silu(g) * u, down.astype(rows.dtype), sizes, **kw)


def megablox_expert_ffn(x: jax.Array, expert_ids: jax.Array, gate_up: jax.Array, down: jax.Array) -> jax.Array:
    """Same contract as `blocked_expert_ffn`, via the TPU grouped matmul of jax's Pallas megablox library
    (`jax.experimental.pallas.ops.tpu.megablox.gmm`, whose backward is its transposed kernel `tgmm`). The
    expert-sorted rows are padded to a multiple of the row tile (the padding rows join the last expert and
    are dropped). On TPU, unlike `jax.lax.ragged_dot`, whose weight gradient libtpu 0.0.42 lowers to a dense
    masked product over all E experts (E/k times the active FLOPs, measured by the AOT check). A Mosaic
    kernel: under a mesh it must run inside `shard_map` (`token_local_experts` does). Off TPU the kernel runs
    in Pallas interpret mode (tests only: slow)."""
    e = gate_up.shape[0]
    m = expert_ids.size
    pad = -m % MEGABLOX_TILING[0]
    rows, flat, unsort = sorted_assignments(x, expert_ids)
    sizes = jnp.bincount(flat, length=e).astype(jnp.int32).at[e - 1].add(pad)
    rows = jnp.pad(rows, ((0, pad), (0, 0)))
    return unsort(megablox_grouped_ffn(rows, sizes, gate_up, down)[:m])


def dense_expert_ffn(x: jax.Array, expert_ids: jax.Array, gate_up: jax.Array, down: jax.Array) -> jax.Array:
    """Same contract as `blocked_expert_ffn`: every expert on every token (E/k times the active compute),
    then the k chosen outputs per token are gathered; no sort, scatter or weight gather. Measured on a
    2-core CPU at the tiny preset (8 experts, top-2): ~2.5x slower than `blocked` at 6k-22k tokens, and
    in the sampler's decode loop (16 rows) slower too, so `blocked` stays the default
    (experiments/benchmarks/cpu_profile.py --moe-impls blocked,dense)."""
    n, _ = expert_ids.shape
    h = jnp.einsum("nh,ehf->enf", x, gate_up.astype(x.dtype))                  # [E, N, 2I]
    g, u = jnp.split(h, 2, axis=-1)
    y = jnp.einsum("enf,efh->enh", jax.nn.silu(g) * u, down.astype(x.dtype))  # [E, N, H]
    return y[expert_ids, jnp.arange(n)[:, None]]                               # [N, k, H]


EXPERT_IMPLS = {"blocked": blocked_expert_ffn, "ragged_dot": ragged_expert_ffn, "megablox": megablox_expert_ffn,
                "dense": dense_expert_ffn}


def token_local_experts(impl: str, x: jax.Array, expert_ids: jax.Array, gate_up: jax.Array, down: jax.Array):
    """`EXPERT_IMPLS[impl]` on each device's own token rows (`map_row_shards`): with a mesh in context the
    sort, the grouped matmul and the unsort run locally (the dispatch never sorts or gathers the global
    batch), the experts' weights cast to the compute dtype and then replicated (all-gathered per layer,
    FSDP-style; their gradients reduced back). Tokens never leave their device: expert parallelism (tokens
    sent to the experts' devices by all-to-all) is a different dispatch.

    Args:
        impl: an `EXPERT_IMPLS` key. x: [N, H] compute dtype. expert_ids: [N, k] int32.
        gate_up: [E, H, 2I]. down: [E, I, H].
    Returns:
        [N, k, H] as `blocked_expert_ffn`, equal to the unsharded call (each token's result depends only on
        its own row).
    """
    return map_row_shards(EXPERT_IMPLS[impl], (x, expert_ids), (gate_up.astype(x.dtype), down.astype(x.dtype)),
                          "tokens")


# Expert-parallel dispatches: moe_impl -> (the local grouped matmul, its row multiple, the token-local impl of
# the same matmul, used without a mesh or when the mesh's 'expert' axis is 1 and so computing the same).
EP_IMPLS = {"ep_ragged_dot": (ragged_grouped_ffn, 1, "ragged_dot"),
            "ep_megablox": (megablox_grouped_ffn, MEGABLOX_TILING[0], "megablox")}
MOE_IMPLS = (*EXPERT_IMPLS, *EP_IMPLS)  # every valid `moe_impl`


def expert_dispatch(impl: str, x: jax.Array, expert_ids: jax.Array, gate_up: jax.Array, down: jax.Array):
    """The routed experts' outputs by `impl`: an `EXPERT_IMPLS` key runs token-local (`token_local_experts`);
    an `EP_IMPLS` key runs expert-parallel (`hat_jax.model.expert_parallel.expert_parallel_ffn`) when the mesh
    in context has an 'expert' axis > 1, else its token-local grouped matmul (the same computation).

    Args:
        impl: a `MOE_IMPLS` name. x: [N, H]. expert_ids: [N, k] int32. gate_up: [E, H, 2I]. down: [E, I, H].
    Returns:
        [N, k, H] unweighted expert outputs.
    Raises:
        ValueError: an unknown impl; an 'expert' axis that does not divide E (expert-parallel impls).
    """
    if impl in EXPERT_IMPLS:
        return token_local_experts(impl, x, expert_ids, gate_up, down)
    if impl not in EP_IMPLS:
        raise ValueError(f"moe impl {impl!r}: expected one of {sorted(MOE_IMPLS)}")
    grouped, row_multiple, local = EP_IMPLS[impl]
    if check_expert_axis(gate_up.shape[0], active_mesh_shape()) == 1:
        return token_local_experts(local, x, expert_ids, gate_up, down)
    return expert_parallel_ffn(grouped, x, expert_ids, gate_up, down, row_multiple)


def _combined(ffn, x, expert_ids, weights, gate_up, down):
    """ffn's [n, k, H] outputs summed over each token's k slots by its routing weights [n, k] -> [n, H]."""
    return jnp.einsum("nkh,nk->nh", ffn(x, expert_ids, gate_up, down), weights)


def _chunked_local(impl, token_chunk, x, expert_ids, weights, gate_up, down):
    """One device's rows through `EXPERT_IMPLS[impl]` and the weighted sum, `token_chunk` rows at a time."""
    return scan_row_chunks(partial(_combined, EXPERT_IMPLS[impl]), token_chunk, (x, expert_ids, weights),
                           (gate_up, down))


def routed_experts(impl: str, x: jax.Array, expert_ids: jax.Array, weights: jax.Array, gate_up: jax.Array,
                   down: jax.Array, token_chunk: int | None = None) -> jax.Array:
    """The routed experts' weighted sum per token: sum_k weights[:, k] * `expert_dispatch`(...)[:, k].

    With `token_chunk`, each device (under a mesh: inside the dispatch's shard_map, on its own rows; without:
    all rows) runs sort -> (exchange) -> grouped matmul -> (exchange back) -> unsort ->
    weighted sum on chunks of `token_chunk` of its rows in a rematerialised `jax.lax.scan`
    (`hat_jax.model.expert_sort.scan_row_chunks`): the [n*k, H] assignment buffers (and the expert-parallel
    receive buffers, P x those) exist for one chunk at a time, in the forward and the backward pass (which
    recomputes each chunk), and the expert weights' gradients are summed over the chunks. A chunk that does not
    divide the device's rows is zero-padded (weight 0, dropped). Exact and dropless, like the unchunked call.
    The router stays outside (its [N, E] logits are returned for the losses anyway). None: `expert_dispatch` and then the weighted sum (the unchunked program).

    Args:
        impl: a `MOE_IMPLS` name. x: [N, H] compute dtype. expert_ids: [N, k] int32. weights: [N, k] (in
        the compute dtype). gate_up: [E, H, 2I]. down: [E, I, H]. token_chunk: tokens per chunk per device, or None.
    Returns:
        [N, H] (the einsum's promotion of the expert outputs' and the weights' dtypes).
    Raises:
        ValueError: as `expert_dispatch`; token_chunk < 1.
    """
    if token_chunk is None:
        return jnp.einsum("nkh,nk->nh", expert_dispatch(impl, x, expert_ids, gate_up, down), weights)
    if token_chunk < 1:
        raise ValueError(f"moe_token_chunk = {token_chunk}: expected a positive number of tokens per chunk, or None")
    if impl not in MOE_IMPLS:
        raise ValueError(f"moe impl {impl!r}: expected one of {sorted(MOE_IMPLS)}")
    if impl in EP_IMPLS:
        grouped, row_multiple, local = EP_IMPLS[impl]
        if check_expert_axis(gate_up.shape[0], active_mesh_shape()) > 1:
            return expert_parallel_ffn(grouped, x, expert_ids, gate_up, down, row_multiple, weights, token_chunk)
        impl = local
    return map_row_shards(partial(_chunked_local, impl, token_chunk), (x, expert_ids, weights),
                          (gate_up.astype(x.dtype), down.astype(x.dtype)), "tokens")


class SparseMoeBlock(nn.Module):
    """Params: gate.kernel [H, E], experts.{gate_up_proj [E, H, 2I], down_proj [E, I, H]},
    shared_expert.{gate_proj, up_proj, down_proj}, shared_expert_gate.kernel [H, 1]."""

    config: Qwen3_5MoeTextConfig
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    impl: str = "blocked"
    token_chunk: int | None = None  # `routed_experts`: tokens per chunk per device (None: unchunked)

    @nn.compact
    def __call__(self, x, forced_expert_ids=None):
        """
        Args:
            x: [B, T, H]. forced_expert_ids: optional [B*T, k] int32 (routing replay).
        Returns:
            (y [B, T, H], router_logits [B*T, E] float32, expert_ids [B*T, k] int32).
        """
        c = self.config
        if self.impl not in MOE_IMPLS:
            raise ValueError(f"moe impl {self.impl!r}: expected one of {sorted(MOE_IMPLS)}")
        b, t, hdim = x.shape
        xf = constrain(x.reshape(b * t, hdim), ("tokens", None))
        dense = lambda n, feats, axes: Linear(feats, axes, self.dtype, self.param_dtype, c.initializer_range, name=n)
        logits = dense("gate", c.num_experts, ("embed", "router"))(xf)
        weights, ids = route(logits, c.num_experts_per_tok, forced_expert_ids)
        gate_up, down = Experts(c, self.param_dtype, name="experts")()
        routed = routed_experts(self.impl, xf, ids, weights.astype(self.dtype), gate_up, down,
                                self.token_chunk)                                    # [N, H]
        s = c.shared_expert_intermediate_size
        shared = SwiGLU(s, self.dtype, self.param_dtype, c.initializer_range, name="shared_expert")(xf)
        shared_gate = jax.nn.sigmoid(dense("shared_expert_gate", 1, ("embed", None))(xf))
        y = routed + shared_gate * shared
        return y.reshape(b, t, hdim), logits.astype(jnp.float32), ids


class Experts(nn.Module):
    """The routed experts' stacked weights."""

    config: Qwen3_5MoeTextConfig
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self):
        c = self.config
        init = nn.initializers.normal(c.initializer_range)
        e, h, i = c.num_experts, c.hidden_size, c.moe_intermediate_size
        gate_up = param_with_axes(self, "gate_up_proj", init, (e, h, 2 * i), self.param_dtype,
                                 ("expert", "expert_embed", "mlp"))
        down = param_with_axes(self, "down_proj", init, (e, i, h), self.param_dtype, ("expert", "mlp", "expert_embed"))
        return gate_up, down


class SwiGLU(nn.Module):
    """`down_proj(silu(gate_proj x) * up_proj x)` (the shared expert, transformers `Qwen3_5MoeMLP`)."""

    intermediate_size: int
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    init_std: float = 0.02

    @nn.compact
    def __call__(self, x):
        dense = lambda n, feats, axes: Linear(feats, axes, self.dtype, self.param_dtype, self.init_std, name=n)
        g = dense("gate_proj", self.intermediate_size, ("embed", "mlp"))(x)
        u = dense("up_proj", self.intermediate_size, ("embed", "mlp"))(x)
        return dense("down_proj", x.shape[-1], ("mlp", "embed"))(jax.nn.silu(g) * u)


def load_balancing_loss(router_logits: jax.Array, top_k: int, token_mask: jax.Array | None = None) -> jax.Array:
    """transformers' `load_balancing_loss_func`, padding excluded.

    loss = E * sum_e f_e * P_e, where over all layers and non-padding tokens
    f_e = (number of top-k assignments to expert e) / (number of token rows)   (so sum_e f_e = k)
    P_e = mean router probability of expert e.
    Layers are pooled (counts and probabilities summed over layers, then divided once), as transformers
    does; the coefficient `router_aux_loss_coef` is applied by the caller.

    Args:
        router_logits: [L, N, E] raw router logits (N = B*T token rows per layer).
        top_k: experts per token.
        token_mask: [N] (bool or 0/1) or None; False/0 rows are padding.
    Returns:
        scalar float32. A uniform router with balanced counts gives exactly k.
    """
    return load_balancing_loss_from_stats(router_stats(router_logits, top_k, token_mask))


def router_z_loss(router_logits: jax.Array, token_mask: jax.Array | None = None) -> jax.Array:
    """ST-MoE router z-loss: mean over layers and non-padding tokens of logsumexp(logits)^2.

    Args:
        router_logits: [L, N, E]. token_mask: [N] or None.
    Returns:
        scalar float32.
    """
    return router_z_loss_from_stats(router_stats(router_logits, 1, token_mask))
