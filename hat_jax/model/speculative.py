"""Speculative decoding with the MTP block as drafter (`SamplingConfig(num_speculative_tokens=k)`).

One step of the decode loop, for every row at once:
1. Verify: one cached forward of the main model over [last, d_1 .. d_k] (k + 1 positions) gives the target
   logits at each; the Gated DeltaNet layers return their conv and state after every position (`cache_steps`).
2. Accept (Leviathan et al. 2023, arXiv 2211.17192; Chen et al. 2023, arXiv 2302.01318). Greedy: the longest
   prefix of drafts equal to the target argmax, then the target's token. Sampling: d_j is accepted with
   probability min(1, p_j(d_j) / q_j(d_j)); the first rejection is replaced by a sample of
   norm(max(0, p_j - q_j)), and after k acceptances a bonus token is sampled from p_k. p and q are the
   distributions `hat_jax.model.sampling._sample` draws from (temperature, top-k, top-p) for the main model
   and the MTP block, so each row's tokens are distributed exactly as without speculation.
3. Cache: rows accept different counts a but share one slot index, so the index advances by k + 1 and the
   slots of rejected drafts are marked invalid (`valid` False: attention ignores them and positions skip
   them, `hat_jax.model.cache`); each row keeps the DeltaNet conv and state after its position a.
4. Draft (DeepSeek-V3's MTP, arXiv 2412.19437, applied recursively as vLLM runs Qwen3-Next/Qwen3.5 MTP):
   the MTP block runs over the verified positions (h_t, token t+1) in its own KV cache (rejected positions
   masked); its output at position a drafts d_1; depth j > 1 feeds the MTP's own output hidden state and
   d_{j-1} at the next position. Those depth > 1 cache entries are provisional and marked invalid after
   drafting (the next step recomputes the positions from the main model's hidden states).

Slots: main cache P + (N-1)(k+1), MTP cache P + (k-1) + (N-1)2k (every step emits at least one token).
Random streams: the first token uses the plain sampler's key, so it equals its output; later ones differ from
the plain sampler's (same distribution), and row b's key is fold_in(fold_in(rng, step), row_offset + b),
independent of B.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hat_jax.model.cache import cache_positions, init_cache
from hat_jax.model.config import FULL_ATTENTION, Qwen3_5MoeTextConfig
from hat_jax.model.process_sync import start_together
from hat_jax.model.rope import rope_cos_sin
from hat_jax.model.sampling import GenerationResult, SamplingConfig, _sample, _Sampling, filtered_logits
from hat_jax.model.transformer import Qwen3_5MoeForCausalLM


def init_mtp_cache(config: Qwen3_5MoeTextConfig, batch: int, max_len: int, dtype=jnp.float32) -> dict:
    """An empty cache of the MTP block's attention layer, laid out as `init_cache` (one layer)."""
    shape = (batch, max_len, config.num_key_value_heads, config.head_dim)
    return {"index": jnp.zeros((), jnp.int32), "valid": jnp.zeros((batch, max_len), bool),
            "layers": [{"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}]}


def mtp_cached(m: Qwen3_5MoeForCausalLM, hidden, next_ids, mask, cache):
    """The MTP block with its cache (a `method=` of the model): hidden [B, T, H] (main post-norm, or the MTP's
    own output), next_ids [B, T] int32 (token t+1), mask [B, T] bool -> (MTP hidden [B, T, H] post-norm, new
    cache); its logits are lm_head(hidden). Positions come from the cache's valid slots, as in the main model."""
    c = m.config
    index, t = cache["index"], next_ids.shape[1]
    valid = jax.lax.dynamic_update_slice(cache["valid"], mask, (0, index))
    cos, sin = rope_cos_sin(cache_positions(valid, index, t), c.rotary_dim, c.rope_parameters.rope_theta)
    x, _, layer = m.mtp(m.model.embed_tokens(next_ids), hidden, cos, sin, mask, jnp.ones(mask.shape, jnp.int32),
                        valid.astype(jnp.int32), False, cache["layers"][0], index)
    return x, {"index": jnp.asarray(index + t, jnp.int32), "valid": valid, "layers": [layer]}


def _row_keys(rng: jax.Array, step, batch: int, purpose: int, row_offset) -> jax.Array:
    """[B] keys fold_in(fold_in(fold_in(rng, step), row_offset + b), purpose)."""
    step_key = jax.random.fold_in(rng, step)
    return jax.vmap(lambda b: jax.random.fold_in(jax.random.fold_in(step_key, b), purpose))(
        jnp.arange(batch) + row_offset)


def draft_token(logits: jax.Array, keys: jax.Array, s: _Sampling) -> tuple[jax.Array, jax.Array]:
    """One draft from MTP logits [B, V] float32 with per-row keys [B]: (tokens [B] int32, q [B, V] float32,
    the processed distribution it was drawn from; [B, 0] when greedy)."""
    if s.greedy:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32), jnp.zeros(logits.shape[:1] + (0,), jnp.float32)
    filtered = filtered_logits(logits / s.temperature, s)
    tokens = jax.vmap(jax.random.categorical)(keys, filtered).astype(jnp.int32)
    return tokens, jax.nn.softmax(filtered, axis=-1)


def accept_drafts(logits: jax.Array, drafts: jax.Array, q: jax.Array, rng: jax.Array, step,
                  s: _Sampling) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The acceptance rule (module docstring) for one verify step.

    Args:
        logits: [B, k+1, V] float32 main-model logits at [last, d_1 .. d_k]. drafts: [B, k] int32.
        q: [B, k, V] float32 the draft distributions (ignored when greedy). rng, step: the key stream.
    Returns:
        (accepted [B] int32 in 0..k, emitted [B, k+1] int32: the drafts, then at position `accepted` the
        corrected or bonus token (later positions are not meaningful), logprobs [B, k+1] float32 of the
        emitted tokens under the main model, as the plain sampler reports them).
    """
    b, k1, _ = logits.shape
    k = k1 - 1
    if s.greedy:
        emitted = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        ok = drafts == emitted[:, :k]
        logp = jax.nn.log_softmax(logits, axis=-1)
    else:
        scaled = logits / s.temperature
        logp = jax.nn.log_softmax(scaled, axis=-1)
        p = jax.nn.softmax(filtered_logits(scaled, s), axis=-1)                      # [B, k+1, V]
        p_d = jnp.take_along_axis(p[:, :k], drafts[..., None], axis=-1)[..., 0]
        q_d = jnp.take_along_axis(q, drafts[..., None], axis=-1)[..., 0]
        u = jax.vmap(lambda key: jax.random.uniform(key, (k,)))(_row_keys(rng, step, b, 0, s.row_offset))
        ok = u * q_d < p_d                                                           # u < p(d) / q(d)
    accepted = jnp.sum(jnp.cumprod(ok.astype(jnp.int32), axis=1), axis=1)
    if not s.greedy:
        rows = jnp.arange(b)
        p_a = p[rows, accepted]
        q_a = jnp.concatenate([q, jnp.zeros_like(q[:, :1])], axis=1)[rows, accepted]  # q = 0 at the bonus
        residual = jnp.maximum(p_a - q_a, 0.0)
        residual = jnp.where(jnp.sum(residual, -1, keepdims=True) > 0, residual, p_a)  # p == q: never rejected
        keys = _row_keys(rng, step, b, 1, s.row_offset)
        fixed = jax.vmap(jax.random.categorical)(keys, jnp.log(residual)).astype(jnp.int32)
        emitted = jnp.concatenate([drafts, drafts[:, :1]], axis=1).at[rows, accepted].set(fixed)
    return accepted, emitted, jnp.take_along_axis(logp, emitted[..., None], axis=-1)[..., 0]


def rewind_cache(cache: dict, accepted: jax.Array, index0, layer_types) -> dict:
    """The main cache after a verify step (`cache_steps` layout) cut back to each row's accepted position.

    Args:
        cache: the verify forward's cache: DeltaNet layers {'conv' [B, k+1, K-1, C], 'state' [B, k+1, ...]},
            attention layers as in `init_cache`. accepted: [B] int32, the verify position to keep (0..k).
        index0: the slot of the verify's first token. layer_types: config.layer_types.
    Returns:
        a cache in the `init_cache` layout: DeltaNet state after position `accepted`, slots of the rejected
        positions invalid (their K/V stay, masked, and are never overwritten: the index moves on).
    """
    rows = jnp.arange(accepted.shape[0])
    layers = [layer if t == FULL_ATTENTION else jax.tree_util.tree_map(lambda a: a[rows, accepted], layer)
              for t, layer in zip(layer_types, cache["layers"])]
    slots = jnp.arange(cache["valid"].shape[1])[None, :]
    valid = cache["valid"] & ((slots < index0) | (slots <= index0 + accepted[:, None]))
    return {"index": cache["index"], "valid": valid, "layers": layers}


def emit_tokens(emitted, logprobs, count, tokens, out_logprobs, lengths, finished, stop_ids):
    """Writes the first `count` [B] of `emitted` [B, T] (and their logprobs) at each row's length, cut after a
    stop token and at N = tokens.shape[1]; rows with count 0 are untouched.
    Returns (tokens [B, N], logprobs [B, N], lengths [B], finished [B])."""
    b, t = emitted.shape
    n = tokens.shape[1]
    j = jnp.arange(t)[None, :]
    is_stop = jnp.any(emitted[..., None] == stop_ids, axis=-1) & (j < count[:, None])
    first_stop = jnp.where(jnp.any(is_stop, 1), jnp.argmax(is_stop, 1), t)
    count = jnp.minimum(jnp.minimum(count, first_stop + 1), n - lengths)
    cols = jnp.where(j < count[:, None], lengths[:, None] + j, n)                   # n: dropped
    rows = jnp.broadcast_to(jnp.arange(b)[:, None], cols.shape)
    tokens = tokens.at[rows, cols].set(emitted, mode="drop")
    out_logprobs = out_logprobs.at[rows, cols].set(logprobs, mode="drop")
    return tokens, out_logprobs, lengths + count, finished | (first_stop < count)


def _draft_chain(mtp, lm_head, hidden, alive, mtp_cache, rng, step, s: _Sampling, k: int):
    """Drafts d_1 .. d_k from the depth-1 MTP output hidden [B, H]: depth j > 1 runs the MTP on (its own
    previous hidden, d_{j-1}); those provisional slots are then marked invalid.
    Returns (drafts [B, k] int32, q [B, k, V] float32 ([B, k, 0] greedy), MTP cache)."""
    b = alive.shape[0]
    drafts, qs = [], []
    start = mtp_cache["index"]
    for j in range(k):
        if j:
            hidden, mtp_cache = mtp(hidden[:, None], drafts[-1][:, None], alive[:, None], mtp_cache)
            hidden = hidden[:, 0]
        d, q = draft_token(lm_head(hidden).astype(jnp.float32), _row_keys(rng, step, b, 2 + j, s.row_offset), s)
        drafts.append(d)
        qs.append(q)
    if k > 1:
        provisional = jnp.zeros((b, k - 1), bool)
        mtp_cache = {**mtp_cache, "valid": jax.lax.dynamic_update_slice(mtp_cache["valid"], provisional, (0, start))}
    return jnp.stack(drafts, 1), jnp.stack(qs, 1), mtp_cache


def _speculative_decode(params, prompt_ids, prompt_mask, rng, s: _Sampling, config, dtype, moe_impl,
                        k: int, moe_token_chunk: int | None = None) -> GenerationResult:
    """The jitted body of `speculative_generate`: prefill, first token, MTP prefill and drafts, then a
    `while_loop` of verify / accept / rewind / emit / draft steps (module docstring) until every row is done."""
    model = Qwen3_5MoeForCausalLM(config, dtype, moe_impl=moe_impl, moe_token_chunk=moe_token_chunk)
    verifier = Qwen3_5MoeForCausalLM(config, dtype, moe_impl=moe_impl, cache_steps=True,
                                     moe_token_chunk=moe_token_chunk)
    mtp = lambda h, ids, mask, cache: model.apply({"params": params}, h, ids, mask, cache, method=mtp_cached)
    lm_head = lambda h: model.apply({"params": params}, h, method=lambda m, h: m.lm_head(h))
    b, p = prompt_ids.shape
    n = s.max_new_tokens
    rows = jnp.arange(b)

    cache = {**init_cache(config, b, p + (n - 1) * (k + 1), dtype), "index": 0}   # static 0: causal prefill
    out = model.apply({"params": params}, prompt_ids, attention_mask=prompt_mask, cache=cache, return_logits=False)
    tok0, lp0 = _sample(lm_head(out.hidden[:, -1]).astype(jnp.float32), jax.random.fold_in(rng, 0), s)
    tokens, logprobs, lengths, finished = emit_tokens(
        tok0[:, None], lp0[:, None], jnp.ones((b,), jnp.int32), jnp.full((b, n), s.pad_id, jnp.int32),
        jnp.zeros((b, n), jnp.float32), jnp.zeros((b,), jnp.int32), jnp.zeros((b,), bool), s.stop_ids)
    mtp_cache = {**init_mtp_cache(config, b, p + (k - 1) + (n - 1) * 2 * k, dtype), "index": 0}
    next_ids = jnp.concatenate([prompt_ids[:, 1:], tok0[:, None]], axis=1)
    m_hidden, mtp_cache = mtp(out.hidden, next_ids, prompt_mask, mtp_cache)
    drafts, q, mtp_cache = _draft_chain(mtp, lm_head, m_hidden[:, -1], ~finished, mtp_cache, rng, 0, s, k)
    zeros = jnp.zeros((b,), jnp.int32)
    state = (jnp.int32(1), out.cache, mtp_cache, tok0, drafts, q, tokens, logprobs, lengths, finished, zeros, zeros)

    def cond(state):
        lengths, finished = state[8], state[9]
        return jnp.any(~finished & (lengths < n))

    def body(state):
        i, cache, mtp_cache, last, drafts, q, tokens, logprobs, lengths, finished, steps, accepted_sum = state
        alive = ~finished & (lengths < n)
        index0 = cache["index"]
        ids = jnp.concatenate([last[:, None], drafts], axis=1)
        mask = jnp.broadcast_to(alive[:, None], ids.shape)
        out = verifier.apply({"params": params}, ids, attention_mask=mask, cache=cache)
        accepted, emitted, lp = accept_drafts(out.logits.astype(jnp.float32), drafts, q, rng, i, s)
        cache = rewind_cache(out.cache, accepted, index0, config.layer_types)
        count = jnp.where(alive, accepted + 1, 0)
        tokens, logprobs, lengths, finished = emit_tokens(emitted, lp, count, tokens, logprobs, lengths, finished,
                                                          s.stop_ids)
        steps, accepted_sum = steps + alive, accepted_sum + jnp.where(alive, accepted, 0)
        # the MTP block over the verified positions: (h_j, emitted_j) for j <= accepted
        mtp_mask = mask & (jnp.arange(k + 1)[None, :] <= accepted[:, None])
        m_hidden, mtp_cache = mtp(out.hidden, emitted, mtp_mask, mtp_cache)
        drafts, q, mtp_cache = _draft_chain(mtp, lm_head, m_hidden[rows, accepted], alive, mtp_cache, rng, i, s, k)
        last = emitted[rows, accepted]
        return i + 1, cache, mtp_cache, last, drafts, q, tokens, logprobs, lengths, finished, steps, accepted_sum

    state = jax.lax.while_loop(cond, body, state)
    tokens, logprobs, lengths, finished, steps, accepted_sum = state[6:]
    return GenerationResult(tokens, logprobs, lengths, finished, verify_steps=steps, accepted_drafts=accepted_sum)


_speculative_decode_jit = start_together(
    jax.jit(_speculative_decode, static_argnames=("config", "dtype", "moe_impl", "k", "moe_token_chunk")),
    "speculative_decode")


def speculative_generate(params: dict, config: Qwen3_5MoeTextConfig, prompt_ids, prompt_mask, rng: jax.Array,
                         sampling: SamplingConfig, dtype=jnp.float32, moe_impl: str = "blocked",
                         moe_token_chunk: int | None = None, row_offset: int = 0) -> GenerationResult:
    """`hat_jax.model.sampler.generate` with `sampling.num_speculative_tokens` = k > 0 (called by it, which
    checks the other arguments). Jitted once per the plain sampler's key plus k.

    Args:
        prompt_ids: [B, P] int32 left-padded; prompt_mask: [B, P] bool; the rest as `generate`.
    Returns:
        GenerationResult: tokens/logprobs [B, N], lengths/finished [B] as the plain sampler's, with
        verify_steps and accepted_drafts [B] int32.
    Raises:
        ValueError: the model has no MTP block (config.mtp_num_hidden_layers = 0), or the params have no MTP
            weights (no `mtp` subtree, e.g. a checkpoint saved without them).
    """
    k = sampling.num_speculative_tokens
    if not config.mtp_num_hidden_layers:
        raise ValueError(f"SamplingConfig.num_speculative_tokens={k} needs the MTP block, but "
                         "config.mtp_num_hidden_layers = 0; set num_speculative_tokens=0")
    if not (hasattr(params, "get") and params.get("mtp")):
        raise ValueError(f"SamplingConfig.num_speculative_tokens={k} needs the MTP block's weights, but the params "
                         "have no MTP weights (no `mtp` subtree; config.mtp_num_hidden_layers="
                         f"{config.mtp_num_hidden_layers}): set num_speculative_tokens=0, or load a checkpoint "
                         "with MTP weights")
    sampling_values = _Sampling.from_config(sampling, row_offset)
    return _speculative_decode_jit(params, prompt_ids, prompt_mask, rng, sampling_values, config=config,
                                   dtype=jnp.dtype(dtype), moe_impl=moe_impl, k=k, moe_token_chunk=moe_token_chunk)
