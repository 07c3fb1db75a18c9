"""The sampler interface: token ids in; token ids, log-probs and routed experts out. `JaxSampler` implements it.

Everything that rolls a policy out (RL, OPD, evaluation) holds one `Sampler` and calls `generate` on ragged
prompt token ids; it never sees padding, device arrays or the decode function. An inference engine (vLLM on
GPU, vllm-tpu on TPU) plugs in by implementing the same protocol, with `with_params` as the point where the
trainer's weights are synced into it.

Conventions of `generate` (every implementation):
- Rows keep the order of the prompts. A row stops at the first of `sampling.stop_token_ids` (included) or
  after `sampling.max_new_tokens` tokens; positions after a row's end hold `sampling.pad_token_id`, logprob 0.
- `logprobs` are the behaviour policy's: log_softmax(logits / temperature) of the sampled token before
  top-k/top-p (greedy: the raw softmax), as `hat_jax.model.sampler` documents.
- Routing (`expert_ids=True`): the top-k experts each token was routed to, per layer, at sampling time, -1
  where none was recorded. Generated token i of row b is `expert_ids[l, b, i]`; prompt token j of a prompt of
  length n is `prompt_expert_ids[l, b, P - n + j]` (P columns, prompts aligned at the end; `prompt_routing`).

`JaxSampler` runs `hat_jax.model.sampler.generate` (one prefill, a cached decode loop) on left-padded rows.
Recompilation is bounded by buckets: the prompt columns are the longest prompt rounded up to a multiple of
`bucket` (capped so prompt + new tokens fit `max_position_embeddings`), and a caller may ask for more rows than
prompts (`rows`: extra rows repeat the first prompt and are dropped from the result), e.g. a power of two
(`batch_bucket`). `bucket` also rounds the columns of the batches the rollouts return (`round_up`).
Memory: `wave_rows` caps the rows of one decode call (the KV cache and the prefill's activations are sized by
it); a larger batch runs in consecutive waves of that many rows, all at the batch's prompt columns, the last
wave filled up with repeats of its first prompt. Each wave samples with its rows' keys in the whole batch
(`row_offset`), so the result equals one call over all rows token for token (the log-probs to fp32 rounding:
the batch size changes how XLA blocks the matmuls).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from hat_jax.model.config import Qwen3_5MoeTextConfig
from hat_jax.model.sampler import generate, left_pad
from hat_jax.model.sampling import SamplingConfig
from hat_jax.model.sharding import host_values

DEFAULT_BUCKET = 64


def round_up(n: int, bucket: int) -> int:
    """The smallest multiple of `bucket` that is >= n (n >= 1)."""
    return -(-max(int(n), 1) // bucket) * bucket


def check_wave_rows(wave_rows, field: str) -> None:
    """Raises ValueError naming `field` unless wave_rows is None or an int >= 1 (a wave holds at least one row)."""
    if wave_rows is not None and (isinstance(wave_rows, bool) or not isinstance(wave_rows, int) or wave_rows < 1):
        raise ValueError(f"{field} = {wave_rows!r}: expected None (all rows in one decode call) or an int >= 1 "
                         "(rows per call)")


def batch_bucket(n: int, limit: int) -> int:
    """Rows to run for `n` live rows: the next power of two >= n, at most `limit` (>= n)."""
    return min(1 << (max(n, 1) - 1).bit_length(), max(limit, n))


def prompt_bucket(longest: int, config: Qwen3_5MoeTextConfig, max_new_tokens: int, bucket: int) -> int:
    """Prompt columns for a batch whose longest prompt has `longest` tokens (module docstring)."""
    return max(longest, min(round_up(longest, bucket), config.max_position_embeddings - max_new_tokens))


@dataclasses.dataclass(frozen=True)
class Generation:
    """What one `generate` call returns, as host numpy arrays; B = the number of prompts, N = max_new_tokens.

    Attributes:
      tokens: int32 [B, N] sampled ids, pad after a row's end. logprobs: float32 [B, N] (0 on pad).
      lengths: int32 [B] tokens generated, the stop token included. finished: bool [B] a stop token came.
      expert_ids: int32 [L, B, N, k] routing of the generated tokens, or None (not requested).
      prompt_expert_ids: int32 [L, B, P, k] routing of the prompt tokens, aligned at the end, or None.
      batch_shape: (rows, prompt columns) the engine ran, for compilation statistics; None if it does not pad.
    """

    tokens: np.ndarray
    logprobs: np.ndarray
    lengths: np.ndarray
    finished: np.ndarray
    expert_ids: np.ndarray | None = None
    prompt_expert_ids: np.ndarray | None = None
    batch_shape: tuple[int, int] | None = None

    def prompt_routing(self, row: int, length: int) -> np.ndarray:
        """int32 [L, length, k]: the routing of the `length` prompt tokens of `row` (module docstring)."""
        return self.prompt_expert_ids[:, row, self.prompt_expert_ids.shape[2] - length:]


class Sampler(Protocol):
    """A policy that samples continuations of token ids (module docstring).

    Attributes:
      tokenizer: the policy's tokenizer (chat template; eos `<|im_end|>` closes a turn).
      model_config: the policy's architecture (context length, vocabulary, layers and top-k for routing).
      bucket: padding bucket of the batches built from its outputs (columns rounded up to a multiple of it).
    """

    tokenizer: Any
    model_config: Qwen3_5MoeTextConfig
    bucket: int

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig, rng: jax.Array, *,
                 rows: int | None = None, expert_ids: bool = False) -> Generation:
        """One continuation per prompt (the module docstring's conventions).

        Args:
          prompts: B >= 1 lists of token ids, each non-empty. sampling: decoding (stop and pad ids included).
          rng: a PRNG key. rows: run this many rows (>= B), a shape hint an engine may ignore.
          expert_ids: also return the routing of every token.
        """
        ...

    def with_params(self, params: Any) -> Sampler:
        """The same sampler with the policy's weights replaced by `params` (the trainer's current ones)."""
        ...


@dataclasses.dataclass(frozen=True)
class JaxSampler:
    """The `Sampler` on the JAX model: `hat_jax.model.sampler.generate` over left-padded, bucketed rows.

    Attributes:
      params: the model params (any float dtype; computed in `dtype`). model_config: their config.
      tokenizer: a fast tokenizer with the Qwen chat template (`hat_jax.tokenizer`).
      dtype: compute dtype of the decode (jnp.float32 or jnp.bfloat16; the cache uses it too).
      moe_impl: expert dispatch, a `hat_jax.model.moe.MOE_IMPLS` name.
      bucket: prompt padding bucket (columns; module docstring).
      generate_fn: the decode function, `hat_jax.model.sampler.generate`'s signature (a scripted one in tests).
      moe_token_chunk: the MoE dispatch's tokens per chunk per device (`hat_jax.model.moe`), None = off.
      wave_rows: rows per decode call (module docstring), None = all rows in one call.
    """

    params: Any
    model_config: Qwen3_5MoeTextConfig
    tokenizer: Any
    dtype: Any = jnp.float32
    moe_impl: str = "blocked"
    bucket: int = DEFAULT_BUCKET
    generate_fn: Callable = generate
    moe_token_chunk: int | None = None
    wave_rows: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.bucket, bool) or not isinstance(self.bucket, int) or self.bucket < 1:
            raise ValueError(f"JaxSampler.bucket = {self.bucket!r}: expected an int >= 1")
        check_wave_rows(self.wave_rows, "JaxSampler.wave_rows")

    def with_params(self, params: Any) -> JaxSampler:
        """This sampler on `params`."""
        return dataclasses.replace(self, params=params)

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig, rng: jax.Array, *,
                 rows: int | None = None, expert_ids: bool = False) -> Generation:
        """See `Sampler.generate`. Raises ValueError: no prompts, rows < len(prompts), or what `generate` raises
        (an empty prompt, prompt + max_new_tokens > max_position_embeddings, ids outside the vocabulary)."""
        n = len(prompts)
        rows = n if rows is None else int(rows)
        if n < 1 or rows < n:
            raise ValueError(f"JaxSampler.generate: {n} prompts in {rows} rows; expected 1 <= prompts <= rows")
        batch = [list(p) for p in prompts] + [list(prompts[0])] * (rows - n)
        width = prompt_bucket(max(map(len, batch)), self.model_config, sampling.max_new_tokens, self.bucket)
        wave = rows if self.wave_rows is None else min(self.wave_rows, rows)
        parts = [self._wave(batch[start:start + wave], wave, width, rng, sampling, expert_ids, start)
                 for start in range(0, n, wave)]  # a wave of filler rows only is not run
        tokens, logprobs, lengths, finished = (np.concatenate(a)[:n] for a in zip(*(p[:4] for p in parts)))
        routing = tuple(np.concatenate(a, axis=1)[:, :n] for a in zip(*(p[4:] for p in parts))) if expert_ids else \
            (None, None)
        return Generation(tokens, logprobs, lengths, finished, *routing, batch_shape=(wave, width))

    def _wave(self, batch, rows: int, width: int, rng, sampling, expert_ids: bool, row_offset: int) -> tuple:
        """One decode call on `batch` (filled up to `rows` with its first prompt) left-padded to `width`:
        (tokens, logprobs, lengths, finished[, expert_ids, prompt_expert_ids]) of its len(batch) rows, numpy."""
        ids, mask = left_pad(batch + [batch[0]] * (rows - len(batch)), sampling.pad_token_id, width)
        kwargs = {"return_expert_ids": True} if expert_ids else {}
        if self.moe_token_chunk is not None:
            kwargs["moe_token_chunk"] = self.moe_token_chunk
        if row_offset:
            kwargs["row_offset"] = row_offset
        res = host_values(self.generate_fn(self.params, self.model_config, ids, mask, rng, sampling,
                                           dtype=self.dtype, moe_impl=self.moe_impl, **kwargs))
        m = len(batch)
        out = tuple(np.asarray(a)[:m] for a in (res.tokens, res.logprobs, res.lengths, res.finished))
        return out + ((np.asarray(res.expert_ids)[:, :m], np.asarray(res.prompt_expert_ids)[:, :m])
                      if expert_ids else ())
