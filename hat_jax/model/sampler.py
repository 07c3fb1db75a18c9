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
- Sampling: logits / temperature -> top-k -> top-p (the order of transformers' logits processors) ->
  `jax.random.categorical`. The key of step i, row b is `fold_in(fold_in(rng, i), row_offset + b)`, so a
  row's samples do not depend on the batch size (the same rng gives row 0 the same tokens alone or in a
  batch), and a batch run in waves (`row_offset` = the wave's first row) draws what it would in one call.
  temperature == 0 is greedy (`argmax`, lowest id on ties; top_k/top_p must then be off).
- `logprobs` are the log-probabilities of the sampled token under the temperature-scaled distribution
  BEFORE top-k/top-p truncation (greedy: under the raw softmax). RL needs the log-prob of the behaviour
  policy as the trainer recomputes it, log_softmax(logits / T), without the truncation the trainer does
  not apply; the truncation's effect is an off-policy mismatch the RL loss must handle, not hide.

Routing replay (opt-in, `return_expert_ids=True`): the top-k expert ids each token was routed to, per
layer, at sampling time. `prompt_expert_ids[l, b, j]` are those of prompt token j in the prefill (-1 on
left padding); `expert_ids[l, b, i]` those of generated token i, recorded by the decode step that feeds
it back (step i + 1). A row's last generated token (its stop token, or token N-1) is never fed back, so
its ids are -1, as are positions after a row finished.

Speculative decoding (`num_speculative_tokens` = k > 0): the MTP block drafts k tokens per step and the
main model verifies them in one forward; tokens are distributed exactly as without it (greedy: identical),
logprobs are the main model's as above (`hat_jax.model.speculative`). Routing replay is refused with it.

Recompilation: `_decode` is jitted once per (prompt shape [B, P], params shapes/dtypes, model config,
compute dtype, moe_impl, moe_token_chunk, max_new_tokens, top_k, greedy or not, top-p on or off, number of
stop ids, return_expert_ids, num_speculative_tokens).
The values of temperature (> 0), top_p (< 1), the stop ids, the pad id and row_offset are traced, so changing
them does not recompile. Bucket P with `left_pad(..., length=...)` to reuse a compilation across prompts.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from hat_jax.model.cache import init_cache
from hat_jax.model.config import Qwen3_5MoeTextConfig
from hat_jax.model.moe import MOE_IMPLS
from hat_jax.model.process_sync import start_together
from hat_jax.model.transformer import Qwen3_5MoeForCausalLM


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingConfig:
    """How to decode. temperature 0 = greedy; top_k 0 = off; top_p 1.0 = off. Decoding stops for a row at
    the first of `stop_token_ids` (included in the output) or after `max_new_tokens` tokens; positions after
    that hold `pad_token_id`. `num_speculative_tokens`: MTP draft tokens verified per step (0 = off;
    `hat_jax.model.speculative`). Raises ValueError naming the offending field."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int
    stop_token_ids: tuple[int, ...] = ()
    pad_token_id: int = 0
    num_speculative_tokens: int = 0

    def __post_init__(self):
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        t, p = self.temperature, self.top_p
        if not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"SamplingConfig.temperature: expected a finite float >= 0, got {t!r}")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise ValueError(f"SamplingConfig.top_k: expected an int >= 0 (0 = off), got {self.top_k!r}")
        if not isinstance(p, (int, float)) or not 0.0 < p <= 1.0:
            raise ValueError(f"SamplingConfig.top_p: expected a float in (0, 1] (1 = off), got {p!r}")
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise ValueError(f"SamplingConfig.max_new_tokens: expected an int >= 1, got {self.max_new_tokens!r}")
        if not all(_is_int(s) and s >= 0 for s in self.stop_token_ids):
            raise ValueError(f"SamplingConfig.stop_token_ids: expected non-negative ints, got {self.stop_token_ids!r}")
        if not _is_int(self.pad_token_id) or self.pad_token_id < 0:
            raise ValueError(f"SamplingConfig.pad_token_id: expected an int >= 0, got {self.pad_token_id!r}")
        k = self.num_speculative_tokens
        if not _is_int(k) or k < 0:
            raise ValueError(f"SamplingConfig.num_speculative_tokens: expected an int >= 0 (0 = off), got {k!r}")
        if k >= self.max_new_tokens:
            raise ValueError(f"SamplingConfig.num_speculative_tokens={k}: a verify step emits at most "
                             f"max_new_tokens - 1 = {self.max_new_tokens - 1} tokens after the first; expected <= that")
        if t == 0 and (self.top_k or p < 1.0):
            raise ValueError(f"SamplingConfig.top_k/top_p (top_k={self.top_k}, top_p={p}) have no effect with "
                             "temperature=0 (greedy): set top_k=0 and top_p=1.0, or a temperature > 0")


@flax.struct.dataclass
class GenerationResult:
    """tokens: [B, N] int32, pad after a row's stop token; logprobs: [B, N] float32 (see the module
    docstring; 0 on pad); lengths: [B] int32 generated tokens, stop token included; finished: [B] bool,
    True when the row produced a stop token. N = max_new_tokens. With `return_expert_ids=True` (else None):
    expert_ids [L, B, N, k] int32 and prompt_expert_ids [L, B, P, k] int32 (module docstring; -1 = none).
    With speculative decoding (else None): verify_steps [B] int32, the verify forwards a row took part in, and
    accepted_drafts [B] int32, the drafts accepted over them (acceptance rate accepted / (steps * k), mean
    accepted length 1 + accepted / steps)."""

    tokens: jax.Array
    logprobs: jax.Array
    lengths: jax.Array
    finished: jax.Array
    expert_ids: jax.Array | None = None
    prompt_expert_ids: jax.Array | None = None
    verify_steps: jax.Array | None = None
    accepted_drafts: jax.Array | None = None


@flax.struct.dataclass
class _Sampling:
    """SamplingConfig split into traced values and static structure (the structure is in the jit cache key)."""

    temperature: jax.Array            # float32 scalar
    top_p: jax.Array                  # float32 scalar
    stop_ids: jax.Array               # [S] int32
    pad_id: jax.Array                 # int32 scalar
    row_offset: jax.Array             # int32 scalar: the batch's first row's index in the keys (waves)
    greedy: bool = flax.struct.field(pytree_node=False)
    top_k: int = flax.struct.field(pytree_node=False)
    use_top_p: bool = flax.struct.field(pytree_node=False)
    max_new_tokens: int = flax.struct.field(pytree_node=False)

    @classmethod
    def from_config(cls, s: SamplingConfig, row_offset: int = 0) -> "_Sampling":
        return cls(jnp.float32(s.temperature if s.temperature > 0 else 1.0), jnp.float32(s.top_p),
                   jnp.asarray(s.stop_token_ids, jnp.int32).reshape(-1), jnp.int32(s.pad_token_id),
                   jnp.int32(row_offset), s.temperature == 0, s.top_k, s.top_p < 1.0, s.max_new_tokens)


def top_k_mask(logits: jax.Array, k: int) -> jax.Array:
    """Keeps exactly the k largest logits per row; ties go to the lower token id.

    Args:
        logits: [..., V] float. k: static int in [1, V].
    Returns:
        [..., V] bool, True for the kept tokens (exactly k per row).
    """
    flat = logits.reshape(-1, logits.shape[-1])
    _, idx = jax.lax.top_k(flat, k)  # lower index first on ties
    keep = jnp.zeros(flat.shape, bool).at[jnp.arange(flat.shape[0])[:, None], idx].set(True)
    return keep.reshape(logits.shape)


def top_p_mask(logits: jax.Array, p: float | jax.Array) -> jax.Array:
    """Nucleus filter: the smallest set of most likely tokens whose probability sums to >= p.

    Tokens are ranked by logit, ties by lower token id (a stable sort), and a rank-r token is kept when the
    probability of the tokens ranked before it is < p; the top-ranked token is therefore always kept.
    Entries already at -inf (e.g. removed by `top_k_mask`) have probability 0 and are never kept beyond
    the first.

    Args:
        logits: [..., V] float (need not be normalised). p: float in (0, 1] (may be traced).
    Returns:
        [..., V] bool, True for the kept tokens.
    """
    order = jnp.argsort(-logits, axis=-1, stable=True)
    probs = jax.nn.softmax(jnp.take_along_axis(logits, order, axis=-1).astype(jnp.float32), axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep_sorted = ((mass_before < p) & (probs > 0)).at[..., 0].set(True)
    ranks = jnp.argsort(order, axis=-1)
    return jnp.take_along_axis(keep_sorted, ranks, axis=-1)


def filtered_logits(scaled: jax.Array, s: _Sampling) -> jax.Array:
    """Temperature-scaled logits [..., V] float32 with the tokens top-k/top-p remove set to -inf: the
    distribution `_sample` draws from is softmax of this."""
    keep = jnp.ones(scaled.shape, bool)
    if s.top_k and s.top_k < scaled.shape[-1]:
        keep = top_k_mask(scaled, s.top_k)
    if s.use_top_p:
        keep = keep & top_p_mask(jnp.where(keep, scaled, -jnp.inf), s.top_p)
    return jnp.where(keep, scaled, -jnp.inf)


def _sample(logits: jax.Array, key: jax.Array, s: _Sampling) -> tuple[jax.Array, jax.Array]:
    """logits [B, V] float32 -> (tokens [B] int32, logprobs [B] float32), per the module docstring."""
    if s.greedy:
        tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        logp = jax.nn.log_softmax(logits, axis=-1)
    else:
        scaled = logits / s.temperature
        logp = jax.nn.log_softmax(scaled, axis=-1)
        filtered = filtered_logits(scaled, s)
        row_keys = jax.vmap(lambda r: jax.random.fold_in(key, r))(jnp.arange(logits.shape[0]) + s.row_offset)
        tokens = jax.vmap(jax.random.categorical)(row_keys, filtered).astype(jnp.int32)
    return tokens, jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]


def sample_tokens(logits: jax.Array, key: jax.Array, sampling: SamplingConfig) -> tuple[jax.Array, jax.Array]:
    """One sampling step as `generate` does it (its stop/pad/max_new_tokens fields are not used here).

    Args:
        logits: [B, V] float (cast to float32). key: a PRNG key (row b uses `fold_in(key, b)`).
    Returns:
        (tokens [B] int32, logprobs [B] float32 as described in the module docstring).
    """
    return _sample(jnp.asarray(logits, jnp.float32), key, _Sampling.from_config(sampling))


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
            num_speculative_tokens > 0 with return_expert_ids or without an MTP block.
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
        from hat_jax.model.speculative import speculative_generate  # it builds on this module

        if return_expert_ids:
            raise ValueError("SamplingConfig.num_speculative_tokens > 0 with return_expert_ids=True: routing "
                             "replay is not supported with speculative decoding; set num_speculative_tokens=0")
        return speculative_generate(params, config, prompt_ids.astype(jnp.int32), prompt_mask.astype(bool), rng,
                                    sampling, jnp.dtype(dtype), moe_impl, moe_token_chunk, row_offset)
    return _decode_jit(params, prompt_ids.astype(jnp.int32), prompt_mask.astype(bool), rng,
                       _Sampling.from_config(sampling, row_offset), config=config, dtype=jnp.dtype(dtype),
                       moe_impl=moe_impl, return_expert_ids=bool(return_expert_ids), moe_token_chunk=moe_token_chunk)
