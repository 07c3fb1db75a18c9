"""Batched single-turn chat generation (greedy by default) for the instruction-following suites (IFEval, ifeval_mini).

Variant implemented and why:
- Each prompt is one user message rendered with the tokenizer's chat template and the generation prompt
  (`<|im_start|>assistant\\n<think>\\n`: the model reasons first, as in the live-stream suites), tokenised
  without extra special tokens, and completed by `hat_jax.model.sampler.generate` (temperature 0 by default;
  with sampling, chunk c uses the key fold_in(key(seed), c)) up to `max_new_tokens` tokens, stopping at `<|im_end|>` (the tokenizer's eos).
- Batches: prompts are sorted by token length (fewer padding columns and prompt buckets), cut into chunks
  of `batch_size`, each chunk left-padded to a multiple of `bucket` columns (`rollout_tokens.prompt_bucket`).
  Every chunk of a call runs with the same number of rows, min(batch_size, next power of two >= the
  number of prompts) (`batch_bucket`; a short last chunk repeats its first prompt, the extra rows are
  dropped), so `generate` compiles once per prompt width. Under greedy decoding a row is independent of
  its batch (the sampler decodes a left-padded row as it would alone), so the order does not change results.
- A prompt whose tokens plus `max_new_tokens` exceed the model's `max_position_embeddings` is not
  generated: its completion is "" and it is flagged in `too_long` (scored as an empty response, so the
  denominators stay the official ones).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hat_jax.model.config import Qwen3_5MoeTextConfig
from hat_jax.model.sampler import SamplingConfig, generate, left_pad
from hat_jax.tokenizer import chat_encoding
from hat_jax.train.rollout_tokens import batch_bucket, decode, prompt_bucket, turn_sampling


@dataclasses.dataclass
class Completions:
    """One completion per prompt, in the prompts' order.

    Attributes:
      texts: decoded completion (special tokens kept, a final `<|im_end|>` removed); "" when too long.
      lengths: tokens generated (the stop token included). finished: ended with `<|im_end|>`.
      too_long: the prompt did not fit (not generated). prompt_tokens: the prompt's token count.
      wall_s: seconds spent, tokenisation and generation.
    """

    texts: list[str]
    lengths: list[int]
    finished: list[bool]
    too_long: list[bool]
    prompt_tokens: list[int]
    wall_s: float


def chat_prompt_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of one user message rendered with the chat template and the generation prompt (`chat_encoding`:
    chat control strings in the message are text, not control ids)."""
    return chat_encoding(tokenizer, [{"role": "user", "content": text}], add_generation_prompt=True).ids


def chat_completions(params: dict, model_config: Qwen3_5MoeTextConfig, tokenizer: Any, prompts: Sequence[str], *,
                     max_new_tokens: int, batch_size: int, bucket: int, dtype=jnp.float32,
                     moe_impl: str = "blocked", progress: bool = False, desc: str = "generate",
                     generate_fn: Callable = generate, temperature: float = 0.0, top_p: float = 1.0,
                     seed: int = 0) -> Completions:
    """Single-turn completions of `prompts` (module docstring); temperature/top_p/seed: decoding (0 = greedy).

    Args:
      params, model_config: the model. tokenizer: a tokenizer with a Qwen-format chat template.
      prompts: user messages. max_new_tokens: tokens per completion at most. batch_size: prompts per
        `generate` call. bucket: prompt padding bucket (columns). dtype, moe_impl: passed to `generate`.
      progress: show a tqdm bar over the batches, labelled `desc`.
      generate_fn: the sampler (`generate`'s signature; tests pass a scripted one).
    Returns:
      Completions.
    Raises:
      ValueError: batch_size, bucket or max_new_tokens < 1.
    """
    if batch_size < 1 or bucket < 1 or max_new_tokens < 1:
        raise ValueError(f"chat_completions: batch_size={batch_size}, bucket={bucket} and max_new_tokens="
                         f"{max_new_tokens} must all be >= 1")
    from tqdm.auto import tqdm

    t0 = time.perf_counter()
    samp = turn_sampling(SamplingConfig(temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens),
                         tokenizer, None)
    eos = int(tokenizer.eos_token_id)
    encoded = [chat_prompt_ids(tokenizer, p) for p in prompts]
    limit = model_config.max_position_embeddings - max_new_tokens
    n = len(prompts)
    texts, lengths, finished = [""] * n, [0] * n, [False] * n
    too_long = [len(ids) > limit for ids in encoded]
    order = sorted((i for i in range(n) if not too_long[i]), key=lambda i: (len(encoded[i]), i))
    chunks = [order[s:s + batch_size] for s in range(0, len(order), batch_size)]
    rows = batch_bucket(min(batch_size, len(order)), batch_size)
    for c, chunk in enumerate(tqdm(chunks, desc=desc, unit="batch", disable=not progress, leave=False)):
        batch = [encoded[i] for i in chunk] + [encoded[chunk[0]]] * (rows - len(chunk))
        p = prompt_bucket(max(map(len, batch)), model_config, max_new_tokens, bucket)
        ids, mask = left_pad(batch, samp.pad_token_id, p)
        rng = jax.random.fold_in(jax.random.key(seed), c)
        res = jax.device_get(generate_fn(params, model_config, ids, mask, rng, samp, dtype=dtype,
                                         moe_impl=moe_impl))
        for r, i in enumerate(chunk):
            k = int(res.lengths[r])
            tokens = [int(t) for t in np.asarray(res.tokens[r, :k])]
            finished[i] = bool(res.finished[r])
            lengths[i] = k
            texts[i] = decode(tokenizer, tokens[:-1] if tokens and tokens[-1] == eos else tokens)
    return Completions(texts, lengths, finished, too_long, [len(ids) for ids in encoded], time.perf_counter() - t0)
