"""Token-level pieces shared by the RL rollouts and OPD sampling: buckets, the environment turn's text,
single-turn sampling, and the routing-replay layout.

Variant implemented and why:
- Conventions (shared by every stage): sequences right-padded with the tokenizer's pad id,
  per-token arrays aligned with `input_ids` (entry t is about token t), action mask 1 exactly on the
  tokens the sampler produced (closing `<|im_end|>` included), `old_logprobs` the sampler's
  log-probabilities of those tokens (log_softmax(logits / temperature) before top-k/top-p, see
  `hat_jax.model.sampler`; with temperature != 1 the trainer must divide its logits by the same
  temperature to be on-policy), 0 elsewhere.
- Sampled text is never re-tokenised: a sequence is prompt tokens + sampled tokens (+ environment
  tokens + sampled tokens ...), concatenated as ids.
- Buckets (recompilation): `generate` compiles once per (batch, prompt length, max_new_tokens, ...).
  Prompt lengths are rounded up to a multiple of `bucket` (default 64, capped so prompt + new tokens
  fit `max_position_embeddings`), batch sizes (multi-turn: the episodes still running) up to the next
  power of two (at most the number of episodes; extra rows repeat the first prompt and are dropped),
  and the returned length T to a multiple of `bucket` (at most the sequence cap). Pass
  `bucket=seq_len` for one fixed T.
- `env_turn_text` writes what the chat template writes for the messages the environment appended
  after an assistant turn (tool responses, hook feedback), preceded by the `\\n` that follows the
  turn's `<|im_end|>` and followed by the generation prompt `<|im_start|>assistant\\n<think>\\n`. It
  is computed with the tokenizer's own template (render an anchor user turn, then the anchor plus the
  new messages with the generation prompt, and take the difference), so it follows the template.
  Tokenised alone it gives the same ids as inside the whole text because it starts right after a
  special token (`<|im_end|>`) and ends with the `<think>` tag plus `\\n`; the `\\n` could merge with
  sampled text that starts with a newline in a full re-tokenisation, which never happens here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hat_jax.model.config import Qwen3_5MoeTextConfig
from hat_jax.model.sampler import SamplingConfig, generate, left_pad
from hat_jax.tokenizer import chat_encoding

DEFAULT_BUCKET = 64
_ANCHOR = ({"role": "user", "content": "x"},)


def round_up(n: int, bucket: int) -> int:
    """The smallest multiple of `bucket` that is >= n (n >= 1)."""
    return -(-max(int(n), 1) // bucket) * bucket


def batch_bucket(n: int, limit: int) -> int:
    """Rows to run for `n` live rows: the next power of two >= n, at most `limit` (>= n)."""
    return min(1 << (max(n, 1) - 1).bit_length(), max(limit, n))


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of `text`, no special tokens added (the chat template already wrote them)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def decode(tokenizer: Any, ids: Sequence[int]) -> str:
    """Text of `ids`, special tokens kept (`<|im_end|>` stays visible)."""
    return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


def env_turn_text(tokenizer: Any, new_messages: Sequence[Mapping[str, Any]]) -> str:
    """Text that follows a sampled assistant turn (which ends with `<|im_end|>`): `\\n`, the chat
    template's rendering of `new_messages`, then the generation prompt (see the module docstring).

    Args:
      tokenizer: a tokenizer with a Qwen-format chat template.
      new_messages: what `LiveStreamEnv.step_text` appended (tool and/or user messages; may be empty).
    Raises:
      ValueError: the template does not render the anchor turn as a prefix (not a ChatML template).
    """
    head = tokenizer.apply_chat_template(list(_ANCHOR), tokenize=False)
    full = tokenizer.apply_chat_template([*_ANCHOR, *map(dict, new_messages)], tokenize=False,
                                         add_generation_prompt=True)
    if not full.startswith(head) or not head.endswith("\n"):
        raise ValueError("env_turn_text: the chat template does not render messages as a prefix-stable "
                         "ChatML conversation (expected turns ending with '<|im_end|>\\n')")
    return "\n" + full[len(head):]


def env_turn_ids(tokenizer: Any, new_messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """Token ids of `env_turn_text(tokenizer, new_messages)`, the messages' content encoded by `chat_encoding` (chat
    control strings in a tool result or viewer message are text, not control ids).

    Raises:
      ValueError: the template is not prefix-stable ChatML (as `env_turn_text`).
    """
    head = chat_encoding(tokenizer, list(_ANCHOR))
    full = chat_encoding(tokenizer, [*_ANCHOR, *map(dict, new_messages)], add_generation_prompt=True)
    if (full.ids[:len(head.ids)] != head.ids or not head.text.endswith("\n")
            or head.offsets[-1] != (len(head.text) - 1, len(head.text))):
        raise ValueError("env_turn_ids: the chat template does not render messages as a prefix-stable "
                         "ChatML conversation (expected turns ending with '<|im_end|>\\n')")
    return [head.ids[-1], *full.ids[len(head.ids):]]


def forced_expert_ids(expert_ids: np.ndarray | jax.Array) -> jax.Array:
    """RolloutBatch.expert_ids [L, N, T, k] -> the model's `forced_expert_ids` layout [L, N*T, k]."""
    num_layers, n, t, k = expert_ids.shape
    return jnp.asarray(expert_ids, jnp.int32).reshape(num_layers, n * t, k)


def fill_unrecorded(expert_ids: np.ndarray) -> np.ndarray:
    """Replaces -1 (no routing recorded) by the ids 0..k-1 in place, so the array can be forced.

    Only positions whose routing no scored token depends on are left unrecorded (an episode's last
    token, right padding); forcing any valid ids there leaves every scored log-prob unchanged.
    """
    k = expert_ids.shape[-1]
    missing = (expert_ids < 0).any(axis=-1)
    expert_ids[missing] = np.arange(k, dtype=expert_ids.dtype)
    return expert_ids


def check_lengths(config: Qwen3_5MoeTextConfig, tokenizer: Any, max_new_tokens: int, seq_len: int | None) -> int:
    """Validates the token budget; returns the sequence cap (default max_position_embeddings - max_new_tokens).

    Raises:
      ValueError: seq_len + max_new_tokens exceeds max_position_embeddings, seq_len < 2, or the
        tokenizer's eos/pad ids are outside the model's vocabulary.
    """
    limit = config.max_position_embeddings - max_new_tokens
    cap = limit if seq_len is None else int(seq_len)
    if cap < 2 or cap > limit:
        raise ValueError(f"seq_len={seq_len}: expected 2 <= seq_len <= max_position_embeddings - max_new_tokens "
                         f"= {config.max_position_embeddings} - {max_new_tokens} = {limit}")
    for name in ("eos_token_id", "pad_token_id"):
        value = getattr(tokenizer, name)
        if value is None or not 0 <= value < config.vocab_size:
            raise ValueError(f"tokenizer.{name}={value!r} is not a token id of the model "
                             f"(vocab_size={config.vocab_size})")
    return cap


def turn_sampling(sampling: SamplingConfig, tokenizer: Any, max_new_tokens: int | None) -> SamplingConfig:
    """`sampling` with stop = (tokenizer eos,) (`<|im_end|>` closes a turn), pad = tokenizer pad and the
    per-turn token budget (`max_new_tokens` if given, else the config's)."""
    return dataclasses.replace(sampling, max_new_tokens=int(max_new_tokens or sampling.max_new_tokens),
                               stop_token_ids=(int(tokenizer.eos_token_id),),
                               pad_token_id=int(tokenizer.pad_token_id))


def prompt_bucket(longest: int, config: Qwen3_5MoeTextConfig, max_new_tokens: int, bucket: int) -> int:
    """Prompt columns for a batch whose longest prompt has `longest` tokens (module docstring)."""
    return max(longest, min(round_up(longest, bucket), config.max_position_embeddings - max_new_tokens))


def right_pad(rows: Sequence[Sequence], length: int, value, dtype) -> np.ndarray:
    """[len(rows), length] array of `rows` right-padded with `value`."""
    out = np.full((len(rows), length), value, dtype)
    for i, row in enumerate(rows):
        out[i, :len(row)] = np.asarray(row, dtype)
    return out


def sample_completions(params: dict, model_config: Qwen3_5MoeTextConfig, tokenizer: Any,
                       prompts: Sequence[Sequence[Mapping[str, Any]]], sampling: SamplingConfig, rng: jax.Array,
                       n_samples: int = 1, seq_len: int | None = None, *, dtype=jnp.float32,
                       moe_impl: str = "blocked", bucket: int = DEFAULT_BUCKET,
                       template_kwargs: Mapping[str, Any] | None = None,
                       generate_fn: Callable = generate) -> dict[str, np.ndarray]:
    """Samples one assistant turn per (prompt, sample) for on-policy distillation.

    Each prompt (a list of chat messages, no tools) is rendered with the tokenizer's chat template and
    the generation prompt, tokenised, and completed once by `generate` (stop at `<|im_end|>`). Rows are
    prompt-major: row i * n_samples + j is sample j of prompt i. A completion that would pass the
    sequence cap is cut there.

    Args:
      params, model_config: the student. tokenizer: a tokenizer with a Qwen-format chat template.
      prompts: P conversations (OpenAI messages ending with a user turn).
      sampling: decoding settings; stop and pad ids are replaced by the tokenizer's eos and pad.
      rng: PRNG key. n_samples: completions per prompt (>= 1).
      seq_len: cap on prompt + completion tokens (default max_position_embeddings - max_new_tokens).
      dtype, moe_impl: passed to `generate`. bucket: see the module docstring.
      template_kwargs: extra `apply_chat_template` arguments (e.g. {"enable_thinking": False}).
      generate_fn: the sampler (default `hat_jax.model.sampler.generate`; tests pass a scripted one).
    Returns:
      dict of numpy arrays, B = P * n_samples rows, T = min(bucketed longest sequence, seq_len):
      input_ids/attention_mask/action_mask int32 [B, T], old_logprobs float32 [B, T],
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
    samp = turn_sampling(sampling, tokenizer, None)
    cap = check_lengths(model_config, tokenizer, samp.max_new_tokens, seq_len)
    encoded = []
    for i, messages in enumerate(prompts):
        ids = chat_encoding(tokenizer, [dict(m) for m in messages], add_generation_prompt=True,
                            **dict(template_kwargs or {})).ids
        if len(ids) >= cap:
            raise ValueError(f"prompts[{i}] has {len(ids)} tokens, no room below seq_len={cap}")
        encoded.append(ids)
    rows = [ids for ids in encoded for _ in range(n_samples)]
    p = prompt_bucket(max(map(len, rows)), model_config, samp.max_new_tokens, bucket)
    ids, mask = left_pad(rows, samp.pad_token_id, p)
    res = jax.device_get(generate_fn(params, model_config, ids, mask, rng, samp, dtype=dtype, moe_impl=moe_impl))
    seqs, acts, lps, comp, fin = [], [], [], [], []
    for r, prompt in enumerate(rows):
        n = min(int(res.lengths[r]), cap - len(prompt))
        seqs.append(prompt + [int(t) for t in res.tokens[r, :n]])
        acts.append([0] * len(prompt) + [1] * n)
        lps.append([0.0] * len(prompt) + [float(x) for x in res.logprobs[r, :n]])
        comp.append(n)
        fin.append(bool(res.finished[r]) and n == int(res.lengths[r]))
    t = min(round_up(max(map(len, seqs)), bucket), cap)
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
