"""Autoregressive decoding for qwen3_5_moe: one prefill call, then one-token steps with the cache.

Variant implemented and why:
- Prompts are LEFT-padded ([B, P] ids + bool mask), so every row's last prompt token sits in column P-1 and
  all rows step in lockstep on one cache slot index (`hat_jax.model.cache`); the model derives positions
  from the cache's `valid` mask, so a padded row decodes as it would alone (tested).
- Prefill is one `Qwen3_5MoeForCausalLM.apply(..., cache=cache)` call over the whole prompt, with
  `return_logits=False`; the lm_head runs on the last hidden state only ([B, V], not [B, P, V]).
- Decoding is a `jax.lax.while_loop` of one-token steps inside the same jitted function as the prefill; it
  stops when every row has produced a stop token or `max_new_tokens` tokens exist. A finished row keeps
  stepping (the batch is one array) but is fed `pad_token_id` with mask False, and its outputs are pad /
  logprob 0.
- Each step draws its tokens and their logprobs with `hat_jax.model.sampling` (temperature, top-k, top-p,
  greedy; logprobs before truncation). The key of step i is `fold_in(rng, i)`, and row b draws with
  `fold_in(that, row_offset + b)`, so a row's samples do not depend on the batch size (the same rng gives
  row 0 the same tokens alone or in a batch), and a batch run in waves (`row_offset` = the wave's first
  row) draws what it would in one call.

Routing replay (opt-in, `return_expert_ids=True`): the top-k expert ids each token was routed to, per
layer, at sampling time. `prompt_expert_ids[l, b, j]` are those of prompt token j in the prefill (-1 on
left padding); `expert_ids[l, b, i]` those of generated token i, recorded by the decode step that feeds
it back (step i + 1). A row's last generated token (its stop token, or token N-1) is never fed back, so
its ids are -1, as are positions after a row finished.

Speculative decoding (`num_speculative_tokens` = k > 0): the MTP block drafts k tokens per step and the
main model verifies them in one forward; tokens are distributed exactly as without it (greedy: identical),
logprobs are the main model's as `hat_jax.model.sampling` defines them (`hat_jax.model.speculative`).
Routing replay is refused with it.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from hat_jax.model.cache import init_cache
from hat_jax.model.config import Qwen3_5MoeTextConfig
from hat_jax.model.moe import MOE_IMPLS
from hat_jax.model.process_sync import start_together
from hat_jax.model.sampling import GenerationResult, SamplingConfig, _sample, _Sampling
from hat_jax.model.speculative import speculative_generate
from hat_jax.model.transformer import Qwen3_5MoeForCausalLM


def left_pad(sequences: Sequence[Sequence[int]], pad_id: int = 0, length: int | None = None):
    """Left-pads python token lists into a batch.

    Args:
        sequences: B non-empty lists of token ids. pad_id: id placed in padding slots.
        length: pad to this many columns (a bucket size, to reuse compilations); default the longest.
    Returns:
        (ids [B, P] np.int32, mask [B, P] np.bool_ True on real tokens).
    Raises:
        ValueError: no sequences, an empty sequence, or a sequence longer than `length`.
    """
    if not sequences:
        raise ValueError("left_pad: no sequences given")
    longest = max(len(s) for s in sequences)
    if any(len(s) == 0 for s in sequences):
        raise ValueError("left_pad: every sequence needs at least one token")
    p = longest if length is None else length
    if longest > p:
        raise ValueError(f"left_pad: a sequence has {longest} tokens, more than length={p}")
    ids = np.full((len(sequences), p), pad_id, np.int32)
    mask = np.zeros((len(sequences), p), bool)
    for row, seq in enumerate(sequences):
        ids[row, p - len(seq):] = np.asarray(seq, np.int32)
        mask[row, p - len(seq):] = True
    return ids, mask


def _decode(params, prompt_ids, prompt_mask, rng, s: _Sampling, config, dtype, moe_impl,
            return_expert_ids: bool = False, moe_token_chunk: int | None = None) -> GenerationResult:
    model = Qwen3_5MoeForCausalLM(config, dtype, moe_impl=moe_impl, moe_token_chunk=moe_token_chunk)
    b, p = prompt_ids.shape
    n = s.max_new_tokens
    num_layers, k = config.num_hidden_layers, config.num_experts_per_tok

    def forward(ids, mask, cache):  # -> (last-position logits [B, V] float32, new cache, ids [L, B, T, k])
        out = model.apply({"params": params}, ids, attention_mask=mask, cache=cache, return_logits=False)
        logits = model.apply({"params": params}, out.hidden[:, -1], method=lambda m, h: m.lm_head(h))
        return logits.astype(jnp.float32), out.cache, out.expert_ids.reshape(num_layers, b, ids.shape[1], k)

    def emit(i, logits, tokens, logprobs, lengths, finished):
        tok, lp = _sample(logits, jax.random.fold_in(rng, i), s)
        alive = ~finished
        tok = jnp.where(alive, tok, s.pad_id)
        tokens = tokens.at[:, i].set(tok)
        logprobs = logprobs.at[:, i].set(jnp.where(alive, lp, 0.0))
        stopped = alive & jnp.any(tok[:, None] == s.stop_ids[None, :], axis=-1)
        return tok, tokens, logprobs, lengths + alive.astype(jnp.int32), finished | stopped

    # A static cache index (0) for the prefill, so its attention skips the masked upper triangle.
    cache = {**init_cache(config, b, p + n, dtype), "index": 0}
    logits, cache, prompt_eids = forward(prompt_ids, prompt_mask, cache)
    prompt_eids = jnp.where(prompt_mask[None, :, :, None], prompt_eids, -1)
    # [L, B, N, k] per generated token when requested, else a [0] placeholder carried untouched
    eids = jnp.full((num_layers, b, n, k) if return_expert_ids else (0,), -1, jnp.int32)
    tokens = jnp.full((b, n), s.pad_id, jnp.int32)
    zeros = jnp.zeros((b, n), jnp.float32), jnp.zeros((b,), jnp.int32), jnp.zeros((b,), bool)
    state = (jnp.int32(1), cache, eids) + emit(0, logits, tokens, *zeros)

    def cond(state):
        i, *_, finished = state
        return (i < n) & ~jnp.all(finished)

    def body(state):
        i, cache, eids, last, tokens, logprobs, lengths, finished = state
        logits, cache, step_eids = forward(last[:, None], ~finished[:, None], cache)
        if return_expert_ids:  # the ids of generated token i - 1, fed back at this step
            step_eids = jnp.where(finished[None, :, None], -1, step_eids[:, :, 0])
            eids = jax.lax.dynamic_update_slice(eids, step_eids[:, :, None], (0, 0, i - 1, 0))
        return (i + 1, cache, eids) + emit(i, logits, tokens, logprobs, lengths, finished)

    _, _, eids, _, tokens, logprobs, lengths, finished = jax.lax.while_loop(cond, body, state)
    if not return_expert_ids:
        return GenerationResult(tokens, logprobs, lengths, finished)
    return GenerationResult(tokens, logprobs, lengths, finished, eids, prompt_eids)


_decode_jit = start_together(
    jax.jit(_decode, static_argnames=("config", "dtype", "moe_impl", "return_expert_ids", "moe_token_chunk")), "decode")


def generate(params: dict, config: Qwen3_5MoeTextConfig, prompt_ids, prompt_mask, rng: jax.Array,
             sampling: SamplingConfig, dtype=jnp.float32, moe_impl: str = "blocked",
             return_expert_ids: bool = False, moe_token_chunk: int | None = None,
             row_offset: int = 0) -> GenerationResult:
    """Decodes up to `sampling.max_new_tokens` tokens after each prompt (jitted; see the module docstring).

    Recompilation: `_decode` is jitted once per (prompt shape [B, P], params shapes/dtypes, model config,
    compute dtype, moe_impl, moe_token_chunk, max_new_tokens, top_k, greedy or not, top-p on or off, number
    of stop ids, return_expert_ids, num_speculative_tokens). The values of temperature (> 0), top_p (< 1), the
    stop ids, the pad id and row_offset are traced, so changing them does not recompile. Bucket P with
    `left_pad(..., length=...)` to reuse a compilation across prompts.

    Args:
        params: model parameters (`init_params` / a loaded checkpoint). config: the model config.
        prompt_ids: [B, P] int32, LEFT-padded (`left_pad`). prompt_mask: [B, P] bool, True on real tokens.
        rng: a PRNG key (unused when greedy). sampling: a SamplingConfig.
        dtype: compute dtype (float32 or bfloat16); the cache uses it too.
        moe_impl: a `hat_jax.model.moe.MOE_IMPLS` name ('blocked', 'ragged_dot', 'dense', 'ep_megablox', ...).
        return_expert_ids: also return the routing of every token at sampling time (routing replay; see
            the module docstring).
        moe_token_chunk: the MoE dispatch's tokens per chunk per device (`hat_jax.model.moe`), None = off.
        row_offset: row b samples with the key of row row_offset + b (a wave of a larger batch: the rows of
            each wave then draw what they would in the one batch).
    Returns:
        GenerationResult with tokens/logprobs [B, N], lengths/finished [B], N = sampling.max_new_tokens;
        with return_expert_ids, expert_ids [L, B, N, k] and prompt_expert_ids [L, B, P, k] (-1 = none).
    Raises:
        ValueError: bad shapes, a right-padded or empty row (checked when the mask is concrete), top_k,
            stop or pad ids outside the vocabulary, P + N > config.max_position_embeddings, unknown moe_impl;
            num_speculative_tokens > 0 with return_expert_ids, without an MTP block in the config or without
            its weights (no `mtp` subtree) in params.
    """
    prompt_ids, prompt_mask = jnp.asarray(prompt_ids), jnp.asarray(prompt_mask)
    if prompt_ids.ndim != 2 or prompt_mask.shape != prompt_ids.shape:
        raise ValueError(f"generate: prompt_ids {prompt_ids.shape} and prompt_mask {prompt_mask.shape} must "
                         "both be [B, P]")
    if not jnp.issubdtype(prompt_ids.dtype, jnp.integer):
        raise ValueError(f"generate: prompt_ids must be integer token ids, got dtype {prompt_ids.dtype}")
    if not isinstance(prompt_mask, jax.core.Tracer):
        m = np.asarray(prompt_mask, bool)
        if not m[:, -1].all() or (m[:, 1:] < m[:, :-1]).any():
            raise ValueError("generate: prompt_mask must be left padding (False... then True...) with at least "
                             "one real token per row; use left_pad()")
    v = config.vocab_size
    if sampling.top_k > v:
        raise ValueError(f"SamplingConfig.top_k={sampling.top_k} exceeds config.vocab_size={v}")
    bad = [t for t in sampling.stop_token_ids + (sampling.pad_token_id,) if t >= v]
    if bad:
        raise ValueError(f"SamplingConfig stop_token_ids/pad_token_id {bad} are >= config.vocab_size={v}")
    total = prompt_ids.shape[1] + sampling.max_new_tokens
    if total > config.max_position_embeddings:
        raise ValueError(f"prompt length + max_new_tokens = {total} exceeds config.max_position_embeddings="
                         f"{config.max_position_embeddings}")
    if moe_impl not in MOE_IMPLS:
        raise ValueError(f"generate: moe_impl {moe_impl!r}: expected one of {sorted(MOE_IMPLS)}")
    if sampling.num_speculative_tokens:
        if return_expert_ids:
            raise ValueError("SamplingConfig.num_speculative_tokens > 0 with return_expert_ids=True: routing "
                             "replay is not supported with speculative decoding; set num_speculative_tokens=0")
        return speculative_generate(params, config, prompt_ids.astype(jnp.int32), prompt_mask.astype(bool), rng,
                                    sampling, jnp.dtype(dtype), moe_impl, moe_token_chunk, row_offset)
    return _decode_jit(params, prompt_ids.astype(jnp.int32), prompt_mask.astype(bool), rng,
                       _Sampling.from_config(sampling, row_offset), config=config, dtype=jnp.dtype(dtype),
                       moe_impl=moe_impl, return_expert_ids=bool(return_expert_ids), moe_token_chunk=moe_token_chunk)
