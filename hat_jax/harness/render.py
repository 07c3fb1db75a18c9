"""Harness + conversation -> system prompt -> chat text -> token ids and loss mask.

Variant implemented and why:
- `render_system_prompt` writes the prompt sections in order under the harness's heading style
  (markdown `## T`, xml `<T>...</T>`, plain `T:`, bracket `【T】`). A section's body is its text, then
  its constraints as `- ` lines (`constraints.constraint_text`, tool names resolved through the
  current harness). The "skills" section lists every skill as `- name: description` (the Agent
  Skills convention: name and description always in the prompt, the body only when loaded), or as
  `- description -> name` when the harness's `skill_listing` is "description_first"; its text
  may say `{skill_tool}`, replaced by the skill tool's current name, else a line naming the tool is
  added. Tools are not written here: `apply_chat_template(tools=h.openai_tools())` puts them first.
- Text is exactly `tokenizer.apply_chat_template(messages, tools=h.openai_tools(), tokenize=False)`
  (the tokenizer's own template, not a copy of it); tokens come from `hat_jax.tokenizer.chat_encoding`, so
  chat control strings inside the system prompt, viewer messages, tool results or tool calls are ordinary
  text, never control ids.
- Loss mask (1 exactly on assistant-generated tokens): at inference the prompt ends with the
  generation prompt `<|im_start|>assistant\\n<think>\\n`, so for each assistant turn rendered with its
  reasoning block the mask is 1 on every token after `<|im_start|>assistant\\n<think>\\n` up to and
  including `<|im_end|>`, and 0 on the newline after it and everywhere else. Assistant turns the
  template renders without reasoning (before the last user query, Qwen's rule) and turns with `"weight": 0` are
  context: mask 0.
  Spans are found in the text by walking the messages in order (each message's header and content are
  matched after the previous one, so message text that looks like a header cannot shift a span), then
  mapped to tokens with the fast tokenizer's offset mapping: a token is 1 iff it starts inside a
  span. (A token merging the last prompt character with the first generated one would start in the
  prompt and be 0; with the Qwen pre-tokenizer this only happens for an empty reasoning block.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hat_jax.harness.constraints import constraint_text
from hat_jax.harness.state import HarnessState, PromptSection
from hat_jax.tokenizer import chat_encoding

SKILL_TOOL_PLACEHOLDER = "{skill_tool}"
_ASSISTANT_HEADER = "<|im_start|>assistant\n"
_THINK_OPEN = "<think>\n"
_TURN_END = "<|im_end|>"


def _heading(style: str, title: str, body: str) -> str:
    if style == "markdown":
        return f"## {title}\n{body}".rstrip("\n")
    if style == "xml":
        return f"<{title}>\n{body}\n</{title}>" if body else f"<{title}></{title}>"
    if style == "plain":
        return f"{title}:\n{body}".rstrip("\n")
    if style == "bracket":
        return f"【{title}】\n{body}".rstrip("\n")
    raise ValueError(f"unknown heading style {style!r}; expected markdown, xml, plain or bracket")


def skill_line(listing: str, name: str, description: str) -> str:
    """One line of the skill list: `- name: description` ("name_first") or `- description -> name`
    ("description_first").

    Raises:
      ValueError: an unknown `listing`.
    """
    if listing == "name_first":
        return f"- {name}: {description}"
    if listing == "description_first":
        return f"- {description} -> {name}"
    raise ValueError(f"unknown skill listing {listing!r}; expected name_first or description_first")


def section_body(h: HarnessState, section: PromptSection) -> str:
    """The body text of one section (text, skill list for "skills", constraint lines), no heading."""
    lines = [section.text.strip()] if section.text.strip() else []
    if section.key == "skills":
        if lines and SKILL_TOOL_PLACEHOLDER in lines[0]:
            lines[0] = lines[0].replace(SKILL_TOOL_PLACEHOLDER, h.skill_tool)
        else:
            lines.append(f"调用 {h.skill_tool} 并传入技能名来加载技能。")
        lines += [skill_line(h.skill_listing, s.name, s.description) for s in h.skills]
    lines += [f"- {constraint_text(c, h)}" for c in section.constraints]
    return "\n".join(lines)


def render_system_prompt(h: HarnessState) -> str:
    """The system prompt of harness `h`: its sections in order, joined by blank lines.

    Raises:
      ValueError: unknown heading style. KeyError: a constraint the registry does not know.
    """
    return "\n\n".join(_heading(h.heading_style, s.title, section_body(h, s)) for s in h.sections)


def render_messages(h: HarnessState, messages: Sequence[Mapping[str, Any]]) -> list[dict]:
    """`messages` with the system message set to `render_system_prompt(h)`.

    A leading system message is replaced (so a trajectory rewritten for an HSA variant gets the
    variant's prompt); otherwise one is prepended. Other messages are shallow-copied unchanged.
    """
    rest = [dict(m) for m in messages]
    if rest and rest[0].get("role") == "system":
        rest = rest[1:]
    return [{"role": "system", "content": render_system_prompt(h)}, *rest]


def episode_messages(episode: Any, h: HarnessState | None = None) -> list[dict]:
    """The messages of an `Episode` as plain dicts, with the system prompt of `h` if given."""
    messages = [dict(m) for m in episode.messages]
    return render_messages(h, messages) if h is not None else messages


def render_text(
    tokenizer: Any, h: HarnessState, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = False
) -> str:
    """`tokenizer.apply_chat_template` of `render_messages(h, messages)` with `h`'s tools, as text."""
    return chat_encoding(tokenizer, render_messages(h, messages), tools=h.openai_tools(),
                         add_generation_prompt=add_generation_prompt).text


def render_ids(
    tokenizer: Any, h: HarnessState, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = False
) -> list[int]:
    """Token ids of `render_text(...)`, content's chat control strings encoded as text (`chat_encoding`)."""
    return chat_encoding(tokenizer, render_messages(h, messages), tools=h.openai_tools(),
                         add_generation_prompt=add_generation_prompt).ids


def _content(message: Mapping[str, Any]) -> str:
    content = message.get("content") or ""
    if not isinstance(content, str):
        content = "".join(part.get("text", "") for part in content)
    return content.strip()


def generated_spans(text: str, messages: Sequence[Mapping[str, Any]]) -> list[tuple[int, int]]:
    """Character spans [start, end) of the assistant-generated parts of `text`.

    Args:
      text: the chat template's rendering of `messages` (tools included or not).
      messages: the messages it was rendered from.
    Returns:
      one span per assistant turn rendered with a `<think>` block: from after
      `<|im_start|>assistant\\n<think>\\n` to the end of its `<|im_end|>`; a turn with `"weight": 0` (OpenAI's
      fine-tuning format: a misread call kept as context, `hat_jax.data.recovery`) gets none.
    Raises:
      ValueError: a message's header or content is not found where expected (the text does not come
        from these messages with a Qwen-format template).
    """
    spans, pos = [], 0
    for i, m in enumerate(messages):
        role, content = m.get("role"), _content(m)
        if role == "assistant":
            start = text.find(_ASSISTANT_HEADER, pos)
            if start < 0:
                raise ValueError(f"messages[{i}]: assistant header not found after position {pos}")
            body = start + len(_ASSISTANT_HEADER)
            end = text.find(_TURN_END, body)
            if end < 0:
                raise ValueError(f"messages[{i}]: assistant turn has no {_TURN_END}")
            if text.startswith(_THINK_OPEN, body) and m.get("weight", 1) != 0:
                spans.append((body + len(_THINK_OPEN), end + len(_TURN_END)))
            pos = end + len(_TURN_END)
            continue
        needle = {
            "user": "<|im_start|>user\n" + content,
            "tool": "<tool_response>\n" + content + "\n</tool_response>",
        }.get(role, content)
        found = text.find(needle, pos)
        if found < 0:
            raise ValueError(f"messages[{i}] ({role}): its rendered text was not found after position {pos}")
        pos = found + len(needle)
    return spans


def render_tokens(
    tokenizer: Any, h: HarnessState, messages: Sequence[Mapping[str, Any]]
) -> tuple[np.ndarray, np.ndarray]:
    """Token ids and loss mask of a conversation under harness `h`.

    Args:
      tokenizer: a fast Hugging Face tokenizer with a Qwen-format chat template (offsets needed).
      h: the harness (its system prompt replaces the conversation's; its tools are rendered).
      messages: OpenAI-format messages (system optional; at least one user message).
    Returns:
      (input_ids, loss_mask): int32 [T] each; input_ids tokenise exactly `render_text(tokenizer, h,
      messages)` (`chat_encoding`: only the template's markers are control ids); loss_mask is 1 on
      assistant-generated tokens (see the module docstring).
    Raises:
      TypeError: `h` is not a HarnessState (arguments swapped).
      ValueError: the tokenizer gives no offsets, or the text does not match the messages.
    """
    if not isinstance(h, HarnessState):
        raise TypeError(f"render_tokens(tokenizer, h, messages): h must be a HarnessState, got {type(h).__name__}")
    full = render_messages(h, messages)
    if not hasattr(tokenizer, "backend_tokenizer"):
        raise ValueError("render_tokens needs a fast tokenizer (offset mapping)")
    enc = chat_encoding(tokenizer, full, tools=h.openai_tools())
    text = enc.text
    ids = np.asarray(enc.ids, dtype=np.int32)
    starts = np.asarray([s for s, _ in enc.offsets], dtype=np.int64)
    mask = np.zeros(len(ids), dtype=np.int32)
    for a, b in generated_spans(text, full):
        mask[(starts >= a) & (starts < b)] = 1
    return ids, mask
