"""Token bookkeeping of a sampled turn: encode/decode, the environment's turn, the turn's sampling settings,
the sequence cap, right padding, and the one count of a turn's reasoning tokens.

Conventions (shared by every rollout):
- Sequences are right-padded with the tokenizer's pad id; per-token arrays are aligned with `input_ids`
  (entry t is about token t); the action mask is 1 exactly on the tokens the sampler produced (closing
  `<|im_end|>` included) and `old_logprobs` are the sampler's log-probs of those tokens, 0 elsewhere (with a
  temperature != 1 the trainer divides its logits by the same temperature to be on-policy).
- Sampled text is never re-tokenised: a sequence is prompt ids + sampled ids (+ environment ids + sampled ids
  ...), concatenated as ids.
- `env_turn_text` is what the chat template writes for the messages the environment appended after an
  assistant turn (tool responses, hook feedback), preceded by the `\\n` that follows the turn's `<|im_end|>`
  and followed by the generation prompt `<|im_start|>assistant\\n<think>\\n`. It is computed with the
  tokenizer's own template (render an anchor user turn, then the anchor plus the new messages with the
  generation prompt, and take the difference). Tokenised alone it gives the same ids as inside the whole text
  because it starts right after a special token (`<|im_end|>`) and ends with the `<think>` tag plus `\\n`.
- Reasoning length (`reasoning_tokens`, used by the CoT reward and the evaluation's statistics): the
  generation prompt ends with `<think>\\n`, so a sampled turn is reasoning up to its `</think>` (all of it when
  it was cut while thinking), `<|im_end|>` removed and surrounding whitespace stripped
  (`hat_jax.tokenizer.split_reasoning`), re-tokenised without special tokens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hat_jax.model.config import Qwen3_5MoeTextConfig
from hat_jax.model.sampling import SamplingConfig
from hat_jax.tokenizer import chat_encoding, split_reasoning

EOS_TEXT = "<|im_end|>"
_ANCHOR = ({"role": "user", "content": "x"},)


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of `text`, no special tokens added (the chat template already wrote them)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def decode(tokenizer: Any, ids: Sequence[int]) -> str:
    """Text of `ids`, special tokens kept (`<|im_end|>` stays visible)."""
    return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


def turn_reasoning(text: str) -> str:
    """The reasoning of one sampled turn's text (module docstring), "" when there is none."""
    return split_reasoning("<think>\n" + text.replace(EOS_TEXT, ""))[0]


def reasoning_tokens(tokenizer: Any, turn_text: str) -> int:
    """Reasoning tokens of one sampled turn (module docstring): 0 when it has no reasoning."""
    reasoning = turn_reasoning(turn_text)
    return len(encode(tokenizer, reasoning)) if reasoning else 0


def env_turn_text(tokenizer: Any, new_messages: Sequence[Mapping[str, Any]]) -> str:
    """Text that follows a sampled assistant turn (which ends with `<|im_end|>`): `\\n`, the chat
    template's rendering of `new_messages`, then the generation prompt (module docstring).

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


def turn_sampling(sampling: SamplingConfig, tokenizer: Any, max_new_tokens: int | None = None) -> SamplingConfig:
    """`sampling` with stop = (tokenizer eos,) (`<|im_end|>` closes a turn), pad = tokenizer pad and the
    per-turn token budget (`max_new_tokens` if given, else the config's)."""
    return dataclasses.replace(sampling, max_new_tokens=int(max_new_tokens or sampling.max_new_tokens),
                               stop_token_ids=(int(tokenizer.eos_token_id),),
                               pad_token_id=int(tokenizer.pad_token_id))


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


def right_pad(rows: Sequence[Sequence], length: int, value, dtype) -> np.ndarray:
    """[len(rows), length] array of `rows` right-padded with `value`."""
    out = np.full((len(rows), length), value, dtype)
    for i, row in enumerate(rows):
        out[i, :len(row)] = np.asarray(row, dtype)
    return out
