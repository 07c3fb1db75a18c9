"""Single-turn completions of chat prompts: as training rows for on-policy distillation (`sample_completions`)
and as texts for the instruction-following suites (`chat_completions`).

Variant implemented and why:
- A prompt (chat messages, no tools) is rendered with the tokenizer's chat template and the generation prompt
  (`<|im_start|>assistant\\n<think>\\n`: the model reasons first, as in the live-stream episodes) and tokenised
  by `chat_encoding` (chat control strings in a message are text, not control ids); one assistant turn is
  sampled by `Sampler.generate`, stopping at `<|im_end|>` (the tokenizer's eos, `turn_sampling`).
- `sample_completions`: every row in one `generate` call, prompt-major (row i * n_samples + j is sample j of
  prompt i), key `rng`; a completion that would pass the sequence cap is cut there; the rows come back
  right-padded with the action mask and old log-probs of `hat_jax.rollout.turns`.
- `chat_completions`: prompts sorted by token length (fewer padding columns and prompt buckets), cut into
  chunks of `batch_size`; every chunk runs in the same number of rows, min(batch_size, next power of two >=
  the number of prompts) (`batch_bucket`), so `generate` compiles once per prompt width; chunk c samples with
  fold_in(key(seed), c). Under greedy decoding a row is independent of its batch, so the order does not
  change results. A prompt whose tokens plus `max_new_tokens` exceed `max_position_embeddings` is not
  generated: its completion is "" and it is flagged in `too_long` (scored as an empty response, so the
  denominators stay the official ones).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from hat_jax.model.sampling import SamplingConfig
from hat_jax.rollout.sampler import Sampler, batch_bucket, round_up
from hat_jax.rollout.turns import check_lengths, decode, right_pad, turn_sampling
from hat_jax.tokenizer import chat_encoding


def chat_prompt_ids(tokenizer: Any, messages: Sequence[Mapping[str, Any]],
                    template_kwargs: Mapping[str, Any] | None = None) -> list[int]:
    """Token ids of `messages` rendered with the chat template and the generation prompt (`chat_encoding`).

    template_kwargs: extra `apply_chat_template` arguments (e.g. {"enable_thinking": False}).
    """
    return chat_encoding(tokenizer, [dict(m) for m in messages], add_generation_prompt=True,
                         **dict(template_kwargs or {})).ids


def sample_completions(sampler: Sampler, prompts: Sequence[Sequence[Mapping[str, Any]]], sampling: SamplingConfig,
                       rng: jax.Array, n_samples: int = 1, seq_len: int | None = None,
                       template_kwargs: Mapping[str, Any] | None = None) -> dict[str, np.ndarray]:
    """Samples one assistant turn per (prompt, sample) for on-policy distillation (module docstring).

    Args:
      sampler: the student. prompts: P conversations (OpenAI messages ending with a user turn).
      sampling: decoding settings; stop and pad ids are replaced by the tokenizer's eos and pad.
      rng: PRNG key. n_samples: completions per prompt (>= 1).
      seq_len: cap on prompt + completion tokens (default max_position_embeddings - max_new_tokens).
      template_kwargs: extra `apply_chat_template` arguments (e.g. {"enable_thinking": False}).
    Returns:
      dict of numpy arrays, B = P * n_samples rows, T = min(longest sequence rounded up to `sampler.bucket`,
      seq_len): input_ids/attention_mask/action_mask int32 [B, T], old_logprobs float32 [B, T],
      group_ids int32 [B] (prompt index), prompt_lengths/completion_lengths int32 [B],
      finished bool [B] (the completion ended with `<|im_end|>` within the cap).
    Raises:
      ValueError: n_samples < 1, no prompts, a prompt of seq_len tokens or more (names its index), or
        a bad seq_len (see `check_lengths`).
    """
    if n_samples < 1:
        raise ValueError(f"n_samples: expected >= 1, got {n_samples}")
    if not prompts:
        raise ValueError("sample_completions: no prompts given")
    tokenizer = sampler.tokenizer
    samp = turn_sampling(sampling, tokenizer)
    cap = check_lengths(sampler.model_config, tokenizer, samp.max_new_tokens, seq_len)
    encoded = []
    for i, messages in enumerate(prompts):
        ids = chat_prompt_ids(tokenizer, messages, template_kwargs)
        if len(ids) >= cap:
            raise ValueError(f"prompts[{i}] has {len(ids)} tokens, no room below seq_len={cap}")
        encoded.append(ids)
    rows = [ids for ids in encoded for _ in range(n_samples)]
    gen = sampler.generate(rows, samp, rng)
    seqs, acts, lps, comp, fin = [], [], [], [], []
    for r, prompt in enumerate(rows):
        n = min(int(gen.lengths[r]), cap - len(prompt))
        seqs.append(prompt + [int(t) for t in gen.tokens[r, :n]])
        acts.append([0] * len(prompt) + [1] * n)
        lps.append([0.0] * len(prompt) + [float(x) for x in gen.logprobs[r, :n]])
        comp.append(n)
        fin.append(bool(gen.finished[r]) and n == int(gen.lengths[r]))
    t = min(round_up(max(map(len, seqs)), sampler.bucket), cap)
    return {
        "input_ids": right_pad(seqs, t, samp.pad_token_id, np.int32),
        "attention_mask": right_pad([[1] * len(s) for s in seqs], t, 0, np.int32),
        "action_mask": right_pad(acts, t, 0, np.int32),
        "old_logprobs": right_pad(lps, t, 0.0, np.float32),
        "group_ids": np.repeat(np.arange(len(prompts), dtype=np.int32), n_samples),
        "prompt_lengths": np.asarray([len(r) for r in rows], np.int32),
        "completion_lengths": np.asarray(comp, np.int32),
        "finished": np.asarray(fin, bool),
    }


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


def chat_completions(sampler: Sampler, prompts: Sequence[str], sampling: SamplingConfig, *, batch_size: int,
                     seed: int = 0, progress: bool = False, desc: str = "generate") -> Completions:
    """Single-turn completions of user messages `prompts` (module docstring).

    Args:
      sampler: the model. prompts: user messages. sampling: decoding (temperature 0 = greedy); its
        max_new_tokens is the budget per completion; stop and pad ids are the tokenizer's.
      batch_size: prompts per `generate` call. seed: chunk c samples with fold_in(key(seed), c).
      progress: show a tqdm bar over the batches, labelled `desc`.
    Returns:
      Completions.
    Raises:
      ValueError: batch_size < 1.
    """
    if batch_size < 1:
        raise ValueError(f"chat_completions: batch_size={batch_size} must be >= 1")
    from tqdm.auto import tqdm

    t0 = time.perf_counter()
    tokenizer = sampler.tokenizer
    samp = turn_sampling(sampling, tokenizer)
    eos = int(tokenizer.eos_token_id)
    encoded = [chat_prompt_ids(tokenizer, [{"role": "user", "content": p}]) for p in prompts]
    limit = sampler.model_config.max_position_embeddings - samp.max_new_tokens
    n = len(prompts)
    texts, lengths, finished = [""] * n, [0] * n, [False] * n
    too_long = [len(ids) > limit for ids in encoded]
    order = sorted((i for i in range(n) if not too_long[i]), key=lambda i: (len(encoded[i]), i))
    chunks = [order[s:s + batch_size] for s in range(0, len(order), batch_size)]
    rows = batch_bucket(min(batch_size, len(order)), batch_size)
    for c, chunk in enumerate(tqdm(chunks, desc=desc, unit="batch", disable=not progress, leave=False)):
        gen = sampler.generate([encoded[i] for i in chunk], samp, jax.random.fold_in(jax.random.key(seed), c),
                               rows=rows)
        for r, i in enumerate(chunk):
            k = int(gen.lengths[r])
            tokens = [int(t) for t in np.asarray(gen.tokens[r, :k])]
            finished[i] = bool(gen.finished[r])
            lengths[i] = k
            texts[i] = decode(tokenizer, tokens[:-1] if tokens and tokens[-1] == eos else tokens)
    return Completions(texts, lengths, finished, too_long, [len(ids) for ids in encoded], time.perf_counter() - t0)
