"""Token sampling for the decoders (`hat_jax.model.sampler`, `hat_jax.model.speculative`): the config, the
logits filters and the draw.

- logits / temperature -> top-k -> top-p (the order of transformers' logits processors) ->
  `jax.random.categorical`; row b of a step draws with `fold_in(key, row_offset + b)`. temperature == 0 is
  greedy (`argmax`, lowest id on ties; top_k/top_p must then be off).
- `logprobs` are the log-probabilities of the sampled token under the temperature-scaled distribution
  BEFORE top-k/top-p truncation (greedy: under the raw softmax). RL needs the log-prob of the behaviour
  policy as the trainer recomputes it, log_softmax(logits / T), without the truncation the trainer does
  not apply; the truncation's effect is an off-policy mismatch the RL loss must handle, not hide.
"""

from __future__ import annotations

import dataclasses
import math

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np


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
    expert_ids [L, B, N, k] int32 and prompt_expert_ids [L, B, P, k] int32 (`hat_jax.model.sampler`'s module
    docstring; -1 = none).
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
