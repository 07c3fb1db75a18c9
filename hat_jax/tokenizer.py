"""Tokenizers for hat-jax: load a Hugging Face tokenizer, train the tiny byte-level BPE, chat format.

Variant implemented and why:
- Real checkpoints bring their own tokenizer folder; `load_tokenizer` opens it with
  `transformers.AutoTokenizer` (local files only).
- The tiny presets train a byte-level BPE with the `tokenizers` library (`train_bpe_tokenizer`),
  built like Qwen's: the Qwen2/Qwen3 pre-tokenizer split (single digits, letter runs, punctuation
  runs), byte-level alphabet and decoder, no normaliser (Qwen applies NFC; we do not, so that
  decode(encode(s)) == s for every UTF-8 string, tool and skill names included).
  The chat control tokens sit at fixed ids 0..8 (`CHAT_TOKENS`), never split. As in Qwen,
  <|endoftext|>, <|im_start|>, <|im_end|> are special (dropped by skip_special_tokens=True) and the
  <think>/<tool_call>/<tool_response> tags are added tokens with special=False, so they survive
  decoding. pad = <|endoftext|>, eos = <|im_end|>, no bos.
- The chat template (`chat_template.jinja`, saved next to tokenizer.json) is our own Jinja text
  producing the Qwen3.5/Qwen3.6 (qwen3_5_moe) format, so vLLM's `qwen3_coder` tool parser and
  `qwen3` reasoning parser read the exported model's output (vLLM recipe for Qwen3.5-35B-A3B:
  `--tool-call-parser qwen3_coder --reasoning-parser qwen3`). Tool calls use the XML-like body
  `<tool_call>\\n<function=NAME>\\n<parameter=ARG>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>`
  (Qwen3.5 and Qwen3-Coder), not Qwen3's JSON body. `parse_tool_calls` and `split_reasoning` read
  that format back.
- Content never produces control ids (`chat_encoding`): only the template's own markers (`<|im_start|>`, the
  `<think>`/`<tool_call>`/`<tool_response>` tags, ...) become added-token ids, whatever strings the messages and
  tool definitions bring. Without such strings in the content this equals `tokenizer(apply_chat_template(...))`
  token for token, but for one added boundary: the `\\n` after `<think>` is always its own token, so the
  generation prompt is a token prefix of the rendered turn.
"""

from __future__ import annotations

import dataclasses
import json
import re
import weakref
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import transformers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

CHAT_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",  # 0: end of document, also the pad token
    "<|im_start|>",  # 1: opens a turn
    "<|im_end|>",  # 2: closes a turn, the eos token
    "<think>",  # 3
    "</think>",  # 4
    "<tool_call>",  # 5
    "</tool_call>",  # 6
    "<tool_response>",  # 7
    "</tool_response>",  # 8
)
CHAT_TOKEN_IDS: dict[str, int] = {tok: i for i, tok in enumerate(CHAT_TOKENS)}
SPECIAL_TOKENS: frozenset[str] = frozenset(CHAT_TOKENS[:3])  # special=True; the tags are special=False
PAD_TOKEN, EOS_TOKEN = "<|endoftext|>", "<|im_end|>"
CHAT_TEMPLATE_PATH = Path(__file__).with_name("chat_template.jinja")
# The pre-tokenizer split of Qwen2/Qwen3 (transformers' Qwen2Tokenizer PRETOKENIZE_REGEX).
QWEN_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Letters never take the character before them (a space, "=", "_"), so a run of letters is split into the same
# tokens wherever it stands: a name listed after ": " and called after "=" is one token sequence.
WORD_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|\p{L}+|\p{N}|[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# As "words", and a run of Han characters is split from a run of other letters, so a name written straight after
# Chinese text ("先加载技能price-promotion", "用get_price") is the same tokens as in a list: without it a small BPE
# trained on the world's texts learns fused tokens such as "，先加载技能price" (docs/tuning.md).
SCRIPT_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|\p{Han}+|[\p{L}&&[^\p{Han}]]+|\p{N}|[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
# As "scripts", and every Han character is its own piece: no merge spans two characters, so a product name is
# the tokens of its characters, each trained wherever the character occurs, instead of one merged token that
# only the world's texts hold. Tried for small's base, where it did not help (docs/tuning.md, "Copying rare
# tokens"); Chinese text is about 1.2x the tokens.
CHAR_SPLIT_PATTERN = SCRIPT_SPLIT_PATTERN.replace(r"\p{Han}+", r"\p{Han}", 1)
SPLIT_PATTERNS = {"qwen": QWEN_SPLIT_PATTERN, "words": WORD_SPLIT_PATTERN, "scripts": SCRIPT_SPLIT_PATTERN,
                  "chars": CHAR_SPLIT_PATTERN}
_PARAM_END = "</parameter>"
_VALUE_FOLLOWERS = ("<parameter=", "</function>", "</tool_call>")  # what may follow a value's </parameter>
_PYTHON_LITERALS = {"True": True, "False": False, "None": None}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def read_chat_template() -> str:
    """Returns the text of hat-jax's Qwen3.5-format chat template (`chat_template.jinja`)."""
    return CHAT_TEMPLATE_PATH.read_text(encoding="utf-8")


def load_tokenizer(path: str | Path) -> transformers.PreTrainedTokenizerBase:
    """Loads a Hugging Face tokenizer folder from local disk (no download).

    Args:
      path: a folder holding tokenizer files (tokenizer.json and/or tokenizer_config.json, ...), e.g.
        a real checkpoint or the output of `train_bpe_tokenizer`.
    Returns:
      the tokenizer from `transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)`,
      with the folder's chat template.
    Raises:
      FileNotFoundError: the folder does not exist or holds none of the tokenizer files.
      OSError: transformers could not build a tokenizer from the files (message names the path).
    """
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"tokenizer folder {str(folder)!r} does not exist")
    if not any((folder / name).is_file() for name in _TOKENIZER_FILES):
        raise FileNotFoundError(
            f"tokenizer folder {str(folder)!r} has no tokenizer files (expected one of {', '.join(_TOKENIZER_FILES)})"
        )
    try:
        return transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as err:  # transformers/tokenizers raise OSError, ValueError, KeyError, ... on bad files
        raise OSError(f"could not load a tokenizer from {str(folder)!r}: {err}") from err


def train_bpe_tokenizer(
    texts: Iterable[str], vocab_size: int, out_dir: str | Path, min_frequency: int = 2, split: str = "qwen"
) -> transformers.PreTrainedTokenizerFast:
    """Trains a byte-level BPE on `texts` and saves it, with the chat template, to `out_dir`.

    The vocabulary is: ids 0..8 the `CHAT_TOKENS`, ids 9..264 the 256 byte symbols, then the merges
    in the order learned (fewer than vocab_size if the corpus runs out of pairs seen min_frequency
    times). Training is deterministic: the same texts give a byte-identical tokenizer.json.

    Args:
      texts: the training corpus, one document per item (iterated once).
      vocab_size: total vocabulary size, chat tokens and the 256 bytes included (so > 265).
      out_dir: folder to write (created if missing); `load_tokenizer(out_dir)` reloads it.
      min_frequency: a pair is merged only if it occurs at least this often.
      split: the pre-tokenizer's split (`SPLIT_PATTERNS`): "qwen", Qwen's (a letter run takes the character
        before it, " get"), "words" (it never does) or "scripts" (neither, and Han runs are split from other
        letters: a name has one segmentation in every context, Chinese text included) or "chars" (as "scripts",
        each Han character alone: no token spans two characters).
    Returns:
      the trained `PreTrainedTokenizerFast` (pad <|endoftext|>, eos <|im_end|>, chat template set).
    Raises:
      ValueError: vocab_size leaves no room beyond the chat tokens and the byte alphabet; an unknown split.
    """
    if split not in SPLIT_PATTERNS:
        raise ValueError(f"tokenizer split {split!r}: expected one of {sorted(SPLIT_PATTERNS)}")
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size <= len(CHAT_TOKENS) + len(alphabet):
        floor = len(CHAT_TOKENS) + len(alphabet)
        raise ValueError(f"vocab_size={vocab_size} must exceed {floor} (the chat tokens and the 256 bytes)")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERNS[split]), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(CHAT_TOKENS),
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    # The trainer adds every chat token as special=True; mark the tags special=False as Qwen does.
    spec = json.loads(tok.to_str())
    for added in spec["added_tokens"]:
        added.update(special=added["content"] in SPECIAL_TOKENS, normalized=False)
    tok = Tokenizer.from_str(json.dumps(spec, ensure_ascii=False))
    if [tok.token_to_id(t) for t in CHAT_TOKENS] != list(CHAT_TOKEN_IDS.values()):
        raise RuntimeError("the BPE trainer did not place the chat tokens at ids 0..8")
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
        model_max_length=262144,
    )
    fast.chat_template = read_chat_template()
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out_dir))
    return fast


def split_reasoning(text: str) -> tuple[str, str]:
    """Splits generated assistant text into its reasoning block and the rest.

    Accepts the text generated after the template's generation prompt (which already holds
    `<think>\\n`, so the text starts with the reasoning and has `</think>` but no `<think>`) as well
    as a whole turn that starts with `<think>`.

    Args:
      text: assistant output, decoded with skip_special_tokens=True or without <|im_end|>.
    Returns:
      (reasoning, content): reasoning stripped of surrounding whitespace ("" if none); content is
      everything after `</think>` with leading newlines removed (tool-call blocks included). Text
      with `<think>` but no `</think>` (cut off while thinking) is all reasoning; text with neither
      is all content.
    """
    if "</think>" in text:
        reasoning, _, content = text.partition("</think>")
        return reasoning.split("<think>")[-1].strip(), content.lstrip("\n")
    if text.lstrip().startswith("<think>"):
        return text.lstrip()[len("<think>") :].strip(), ""
    return "", text


def _schema_properties(tools: Sequence[dict] | None, name: str) -> dict | None:
    """The JSON-schema `properties` of tool `name` (OpenAI `function` or MCP `inputSchema` form)."""
    for tool in tools or ():
        fn = tool.get("function", tool)
        if fn.get("name") == name:
            schema = fn.get("parameters") or fn.get("inputSchema") or fn.get("input_schema") or {}
            return schema.get("properties", {})
    return None


def _decode_value(raw: str, prop: dict | None, where: str) -> Any:
    """Turns a parameter's text back into a value: raw for strings, JSON for everything else."""
    kind = prop.get("type") if isinstance(prop, dict) else None
    if kind == "string":
        return raw
    if kind is None or isinstance(kind, list):  # untyped: JSON if it decodes to a non-string
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            return raw
        return raw if isinstance(value, str) else value
    if raw in _PYTHON_LITERALS:  # Qwen3.5 checkpoints write True/False/None (Python str())
        return _PYTHON_LITERALS[raw]
    try:
        return json.loads(raw)
    except json.JSONDecodeError as err:
        raise ValueError(f"{where}: value {raw!r} is not valid JSON for schema type {kind!r}") from err


def _skip_space(body: str, pos: int) -> int:
    """The first position at or after pos that is not whitespace."""
    while pos < len(body) and body[pos].isspace():
        pos += 1
    return pos


def _read_tag(body: str, pos: int, prefix: str, where: str) -> tuple[str, int]:
    """Reads `<prefix NAME>` at pos; returns (NAME, position after '>')."""
    close = body.find(">", pos)
    name = body[pos + len(prefix) : close].strip() if close != -1 else ""
    if close == -1 or "\n" in body[pos:close]:
        raise ValueError(f"{where}: unterminated {prefix}... tag")
    if not name:
        raise ValueError(f"{where}: empty name in {prefix}>")
    return name, close + 1


def _parse_call(body: str, pos: int, tools: Sequence[dict] | None, where: str) -> tuple[dict, int]:
    """Parses one call whose `<tool_call>` ends just before pos; returns (call, position after it)."""
    pos = _skip_space(body, pos)
    if not body.startswith("<function=", pos):
        got = body[pos : pos + 30]
        if not got:
            raise ValueError(f"{where}: unclosed <tool_call>")
        raise ValueError(f"{where}: expected <function=NAME> after <tool_call>, got {got!r}")
    name, pos = _read_tag(body, pos, "<function=", where)
    where = f"{where} ({name})"
    props = _schema_properties(tools, name) or {}
    args: dict[str, Any] = {}
    while not body.startswith("</function>", pos := _skip_space(body, pos)):
        if not body.startswith("<parameter=", pos):
            got = body[pos : pos + 30]
            if not got or got.startswith("</tool_call>"):
                raise ValueError(f"{where}: missing </function>")
            raise ValueError(f"{where}: expected <parameter=ARG> or </function>, got {got!r}")
        arg, pos = _read_tag(body, pos, "<parameter=", where)
        if arg in args:
            raise ValueError(f"{where}: duplicate parameter {arg!r}")
        start = pos + 1 if body.startswith("\n", pos) else pos
        end = body.find("</parameter>", start)
        while end != -1 and not body[end + len(_PARAM_END) :].lstrip().startswith(_VALUE_FOLLOWERS):
            end = body.find(_PARAM_END, end + len(_PARAM_END))  # a literal </parameter> inside the value
        if end == -1:
            raise ValueError(f"{where}: parameter {arg!r} has no closing </parameter>")
        raw = body[start:end].removesuffix("\n")
        args[arg] = _decode_value(raw, props.get(arg), f"{where}, parameter {arg!r}")
        pos = end + len("</parameter>")
    pos = _skip_space(body, pos + len("</function>"))
    if not body.startswith("</tool_call>", pos):
        raise ValueError(f"{where}: missing </tool_call> after </function>")
    return {"name": name, "arguments": args}, pos + len("</tool_call>")


def parse_tool_calls(text: str, tools: Sequence[dict] | None = None) -> list[dict]:
    """Parses the tool calls in generated assistant text (the format `chat_template.jinja` writes).

    Each call is `<tool_call>\\n<function=NAME>\\n<parameter=ARG>\\nVALUE\\n</parameter>...
    </function>\\n</tool_call>`. One newline after `<parameter=ARG>` and one before `</parameter>`
    are part of the format; a `</parameter>` ends a value only when `<parameter=`, `</function>` or
    `</tool_call>` comes next, so values may contain the literal tag. Any `<think>...</think>` block is skipped
    first. Other text between calls is ignored, but a stray `<function=`, `</function>` or
    `</tool_call>` outside a `<tool_call>` block is an error.

    The format is typeless: the template writes strings raw and other values as JSON. With `tools`
    (OpenAI-style `{"type": "function", "function": {..., "parameters": schema}}` or MCP
    `{"name", "inputSchema"}`), a property typed "string" stays raw text and other types are JSON
    decoded (Qwen3.5's Python literals True/False/None accepted). Without a schema, a value that
    parses as JSON to a non-string (number, true/false, null, object, array) is decoded and
    anything else stays a string, so a string argument that looks like JSON ("42", "true") comes
    back decoded: pass `tools` when that matters.

    Args:
      text: generated assistant text.
      tools: optional tool definitions used to type the parameters.
    Returns:
      [{"name": str, "arguments": {arg: value}}], in the order written; [] when there is no call.
    Raises:
      ValueError: a malformed call, naming the call and the problem (unclosed <tool_call>, missing
        or empty <function=...>, unclosed <parameter=...>, duplicate parameter, unexpected text
        inside the call, missing </function> or </tool_call>, a stray tag outside a call, or a
        value that is not valid JSON for its schema type).
    """
    _, body = split_reasoning(text)
    calls: list[dict] = []
    pos = 0
    while (start := body.find("<tool_call>", pos)) != -1:
        _check_outside_text(body[pos:start])
        call, pos = _parse_call(body, start + len("<tool_call>"), tools, f"tool call {len(calls) + 1}")
        calls.append(call)
    _check_outside_text(body[pos:])
    return calls


def _check_outside_text(text: str) -> None:
    """Raises if text outside the <tool_call> blocks holds a stray call tag."""
    for tag in ("<function=", "</function>", "</tool_call>"):
        if tag in text:
            raise ValueError(f"{tag!r} outside a <tool_call>...</tool_call> block")


# ---------------------------------------------------------------------------------------------- chat encoding

@dataclasses.dataclass(frozen=True)
class ChatEncoding:
    """A rendered conversation and its tokens.

    text: the chat template's text. ids: token ids (list[int], length T). offsets: [(start, end)] character span of
    each token in `text` (length T).
    """

    text: str
    ids: list[int]
    offsets: list[tuple[int, int]]


_PLAIN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # backend tokenizer -> copy without added tokens
_PLACEHOLDER_BASES = (0xF0000, 0x100000, 0xE000, 0xF8000, 0x108000)  # private-use planes and the BMP's private area


def _plain_tokenizer(tokenizer: Any) -> Tokenizer:
    """The tokenizer's backend without its added vocabulary (normaliser, pre-tokenizer and model unchanged)."""
    backend = tokenizer.backend_tokenizer
    plain = _PLAIN.get(backend)
    if plain is None:
        spec = json.loads(backend.to_str())
        spec["added_tokens"] = []
        plain = _PLAIN[backend] = Tokenizer.from_str(json.dumps(spec, ensure_ascii=False))
    return plain


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)


def _map_strings(value: Any, fn) -> Any:
    """`value` with every string (keys of mappings included) replaced by fn(string); containers copied."""
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, Mapping):
        return {fn(k) if isinstance(k, str) else k: _map_strings(v, fn) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_map_strings(v, fn) for v in value]
    return value


def _split_inline_reasoning(message: Mapping[str, Any]) -> dict:
    """An assistant message whose content holds `...</think>` (and no reasoning_content) split as the template does,
    so that neutralising the tags cannot change how the template splits it."""
    m = dict(message)
    content = m.get("content")
    if m.get("role") == "assistant" and not isinstance(m.get("reasoning_content"), str) and isinstance(content, str):
        text = content.strip()
        if "</think>" in text:
            m["reasoning_content"] = text.split("</think>")[0].split("<think>")[-1]
            m["content"] = text.split("</think>")[-1].lstrip("\n")
    return m


def _break_after_think(pieces: list[tuple[int, int, int | None]], text: str) -> list[tuple[int, int, int | None]]:
    """Text pieces that follow a `<think>` marker and start with a newline split after that newline."""
    out = []
    for i, (a, b, tid) in enumerate(pieces):
        after_think = i > 0 and pieces[i - 1][2] is not None and text[pieces[i - 1][0]:pieces[i - 1][1]] == "<think>"
        if tid is None and after_think and text.startswith("\n", a) and b - a > 1:
            out += [(a, a + 1, None), (a + 1, b, None)]
        else:
            out.append((a, b, tid))
    return out


def chat_encoding(tokenizer: Any, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping] | None = None,
                  add_generation_prompt: bool = False, **template_kwargs: Any) -> ChatEncoding:
    """Renders `messages` with the tokenizer's chat template and tokenises it so that only the template's own
    markers become added-token (control) ids.

    Every string the messages and tool definitions bring (user, tool, system and assistant text, reasoning,
    tool-call names and arguments) is rendered with each added-token string replaced by a same-length placeholder
    of private-use characters, so the added-token strings left in the rendered text are exactly the template's;
    the text between them is encoded by the tokenizer without its added vocabulary (the placeholders put back
    first), and the markers' ids are spliced in. Without such strings in the content this equals
    `tokenizer(apply_chat_template(...))` token for token: a fast tokenizer splits at added tokens before
    pre-tokenising, at the same places. One boundary is added: the `\\n` after `<think>` is always its own token,
    as it is at the end of the generation prompt `<|im_start|>assistant\\n<think>\\n`. Otherwise an empty
    reasoning block (`<think>\\n\\n</think>`) would encode `\\n\\n` as one token, and the generation prompt would
    not be a token prefix of the rendered turn (the model never samples across the prompt's end).

    Args:
      tokenizer: a fast Hugging Face tokenizer with a chat template (e.g. `load_tokenizer`).
      messages: OpenAI-format messages. tools: OpenAI-format tool definitions (or None).
      add_generation_prompt, template_kwargs: passed to `apply_chat_template` (e.g. enable_thinking=False).
    Returns:
      ChatEncoding(text, ids, offsets): `text` is the template's rendering of the messages; an added-token string
      inside any content is encoded as ordinary text (its bytes), never as its control id.
    Raises:
      ValueError / jinja2 errors: whatever the template raises for malformed messages.
    """
    added = sorted(tokenizer.get_added_vocab().items(), key=lambda kv: -len(kv[0]))
    messages = [_split_inline_reasoning(m) for m in messages]
    seen = set("".join(_strings([messages, tools or []])))
    base = next(b for b in _PLACEHOLDER_BASES if not any(chr(b + i) in seen for i in range(len(added))))
    holders = {tok: chr(base + i) * len(tok) for i, (tok, _) in enumerate(added)}
    marker = re.compile("|".join(re.escape(tok) for tok, _ in added)) if added else None

    def neutral(text: str) -> str:
        return marker.sub(lambda m: holders[m.group(0)], text) if marker else text

    rendered = tokenizer.apply_chat_template(_map_strings(messages, neutral),
                                             tools=_map_strings(list(tools), neutral) if tools else None,
                                             tokenize=False, add_generation_prompt=add_generation_prompt,
                                             **template_kwargs)
    text = rendered
    for tok, holder in holders.items():
        text = text.replace(holder, tok)
    ids_of = dict(added)
    pieces, pos = [], 0   # (start, end, id or None for a text segment)
    for m in (marker.finditer(rendered) if marker else ()):
        if m.start() > pos:
            pieces.append((pos, m.start(), None))
        pieces.append((m.start(), m.end(), ids_of[m.group(0)]))
        pos = m.end()
    if pos < len(rendered):
        pieces.append((pos, len(rendered), None))
    pieces = _break_after_think(pieces, text)
    segments = [text[a:b] for a, b, tid in pieces if tid is None]
    encoded = iter(_plain_tokenizer(tokenizer).encode_batch(segments, add_special_tokens=False) if segments else ())
    ids, offsets = [], []
    for a, b, tid in pieces:
        if tid is not None:
            ids.append(int(tid))
            offsets.append((a, b))
            continue
        enc = next(encoded)
        ids += enc.ids
        offsets += [(a + s, a + e) for s, e in enc.offsets]
    return ChatEncoding(text, ids, offsets)
