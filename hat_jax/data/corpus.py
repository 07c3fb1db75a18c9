"""The pretraining corpus of the tiny base model, the tokenizer's training texts, and the recall probe.

Variant implemented and why: at tiny scale, reading a harness is associative recall (bind the intent
to the tool name written next to it in the prompt and copy the name), which the base model must
learn before SFT, from data with no live-stream content:
- Two kinds of chats, in OpenAI message format with OpenAI tool dicts, rendered by our chat template:
  (a) general instruction following: an IFEval-style prompt from `general.py` (IFEval, Zhou et al.
      2023, arXiv 2311.07911) with its rule-based response and a short reasoning block;
  (b) generic tool use in other domains (weather, recipes, library, trains, unit conversion; a small
      fake world per domain, built per chat) under a RANDOM harness: tool names of 2-3 word pieces
      in a random naming style (snake_case, camelCase, kebab-case by default: HSA's training styles;
      dotted on request, as it is one of HSA's held-out families), random argument names, a
      system prompt listing the tools in a random layout, English or Chinese. The assistant reasons
      (naming the tool by its description, never by name), then calls the right tool: its name must
      be copied from the prompt (associative recall), the skill the live-stream harness needs.
      A tool message carries the result and the final answer copies it.
- No live-stream or shopping data: that is what SFT teaches, and Harness-Variant QA must not leak.
- The word pieces and naming styles are arguments: pass the HSA training pools so the held-out
  families stay unseen, and so every piece's embedding is trained (a name built from untrained tokens
  is never produced: 0% in a recall probe while designing hat-jax).
- `recall_probe` cuts a fresh tool chat just before the tool name: the base-pretraining run logs the
  exact-copy rate on it.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Iterable, Sequence
from typing import Any

from transformers.utils.chat_template_utils import render_jinja_template

from hat_jax.data import general
from hat_jax.data.corpus_domains import DOMAINS, Intent
from hat_jax.data.reading import KINDS as READING_KINDS
from hat_jax.data.reading import reading_chats
from hat_jax.tokenizer import read_chat_template

NAMING_STYLES: tuple[str, ...] = ("snake", "camel", "kebab", "dotted")
# The default: HSA's training styles (`hsa_vocab.TRAIN_TOOL_STYLES`); dotted names are one of HSA's
# held-out families for Harness-Variant QA, so the corpus does not use them unless asked to.
TRAIN_NAMING_STYLES: tuple[str, ...] = ("snake", "camel", "kebab")
NAME_PIECES: tuple[str, ...] = (
    "get", "fetch", "find", "lookup", "query", "check", "read", "load", "show", "list", "calc", "run",
    "info", "data", "item", "record", "entry", "status", "report", "detail", "meta", "value", "index",
    "table", "node", "task", "job", "box", "tool", "kit", "hub", "desk", "port", "link", "map", "log",
    "spec", "view", "sync", "scan",
)  # fmt: skip
ARG_PIECES: tuple[str, ...] = (
    "q", "key", "name", "id", "ref", "text", "target", "input", "src", "dst", "arg", "param", "field",
    "label", "term", "code", "slot", "val", "opt", "sel",
)  # fmt: skip
SYSTEM_LAYOUTS: tuple[str, ...] = ("markdown", "plain", "xml")


@dataclasses.dataclass(frozen=True)
class RecallProbe:
    """A prompt whose next characters must be a tool name copied from it.

    Render `apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    + assistant_prefix`; a model copies correctly when its continuation starts with
    `expected_name + ">"` (the prefix ends in `<tool_call>\\n<function=`).
    """

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    assistant_prefix: str
    expected_name: str


def style_name(pieces: Sequence[str], style: str) -> str:
    """Joins word pieces in a naming style: snake a_b, camel aB, kebab a-b, dotted a.b.

    Raises:
      ValueError: unknown style.
    """
    if style == "snake":
        return "_".join(pieces)
    if style == "camel":
        return pieces[0] + "".join(p[:1].upper() + p[1:] for p in pieces[1:])
    if style == "kebab":
        return "-".join(pieces)
    if style == "dotted":
        return ".".join(pieces)
    raise ValueError(f"unknown naming style {style!r} (expected one of {NAMING_STYLES})")


def _random_names(rng: random.Random, k: int, pieces: Sequence[str], style: str, lo: int, hi: int) -> list[str]:
    """k distinct names of lo..hi pieces each, in one style."""
    names: list[str] = []
    while len(names) < k:
        name = style_name(rng.sample(list(pieces), rng.randint(lo, hi)), style)
        if name not in names:
            names.append(name)
    return names


def _tool_dict(name: str, intent: Intent, arg_names: dict[str, str], lang: str) -> dict[str, Any]:
    """The OpenAI tool dict of one intent under surface tool and argument names."""
    props = {}
    for arg in intent.args:
        prop: dict[str, Any] = {"type": arg.type, "description": arg.desc[lang]}
        if arg.enum:
            prop["enum"] = list(arg.enum)
        props[arg_names[arg.name]] = prop
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": intent.desc[lang],
            "parameters": {"type": "object", "properties": props, "required": list(props)},
        },
    }


_SYSTEM_TEXT = {
    "en": ("You are a helpful assistant for {domain}.", "Use a tool for every fact; answer from its result."),
    "zh": ("你是{domain}助手。", "每个事实都要调用工具获取,并根据工具结果回答。"),
}


def _system_prompt(domain: str, tools: list[dict[str, Any]], layout: str, lang: str) -> str:
    """The system prompt listing the tools (name and description) in one layout."""
    role, rule = (t.format(domain=domain) for t in _SYSTEM_TEXT[lang])
    rows = [(t["function"]["name"], t["function"]["description"]) for t in tools]
    head = "工具" if lang == "zh" else "Tools"
    if layout == "markdown":
        listing = f"## {head}\n" + "\n".join(f"- `{n}`: {d}" for n, d in rows)
        return f"{role}\n\n{listing}\n\n{rule}"
    if layout == "plain":
        listing = f"{head}:\n" + "\n".join(f"{n} - {d}" for n, d in rows)
        return f"{role}\n{listing}\n{rule}"
    if layout == "xml":
        listing = "<tools>\n" + "\n".join(f'<tool name="{n}">{d}</tool>' for n, d in rows) + "\n</tools>"
        return f"<role>{role}</role>\n{listing}\n<rules>{rule}</rules>"
    raise ValueError(f"unknown system layout {layout!r} (expected one of {SYSTEM_LAYOUTS})")


def _tool_chat(
    rng: random.Random, pieces: Sequence[str], styles: Sequence[str], layouts: Sequence[str], zh_share: float
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str, str]:
    """One tool-use chat under a random harness: (messages, tools, reasoning of the call, tool name)."""
    lang = "zh" if rng.random() < zh_share else "en"
    domain = rng.choice(DOMAINS)
    world = domain.make_world(rng)
    target = rng.choice(domain.intents)
    others = [i for d in DOMAINS if d is not domain for i in d.intents]
    intents = list(domain.intents) + rng.sample(others, rng.randint(1, 3))
    rng.shuffle(intents)
    style = rng.choice(list(styles))
    names = _random_names(rng, len(intents), pieces, style, 2, 3)
    tools, target_tool = [], None
    for name, intent in zip(names, intents, strict=True):
        arg_names = dict(
            zip(
                [a.name for a in intent.args],
                _random_names(rng, len(intent.args), ARG_PIECES, style, 1, 2),
                strict=True,
            )
        )
        tools.append(_tool_dict(name, intent, arg_names, lang))
        if intent is target:
            target_tool, target_args = name, arg_names
    values = target.sample_args(world, rng, lang)
    result = target.run(world, values, lang)
    question = rng.choice(target.questions[lang]).format(**values)
    call_args = {target_args[k]: v for k, v in values.items()}
    shown = ", ".join(f"{target_args[k]}={v}" for k, v in values.items())
    if lang == "zh":
        think_call = f"用户想知道:{target.gist['zh']}。描述为「{target.desc['zh']}」的工具正合适,参数:{shown}。"
        think_answer = "工具已返回结果,我用结果中的事实回答。"
    else:
        think_call = (
            f'The user asks for {target.gist["en"]}. The tool described as "{target.desc["en"]}" fits;'
            f" arguments: {shown}."
        )
        think_answer = "The tool returned the result; I answer with its facts."
    system = _system_prompt(domain.title[lang], tools, rng.choice(list(layouts)), lang)
    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": question},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": think_call,
            "tool_calls": [{"type": "function", "function": {"name": target_tool, "arguments": call_args}}],
        },
        {"role": "tool", "name": target_tool, "content": json.dumps(result, ensure_ascii=False)},
        {"role": "assistant", "content": target.answer(values, result, lang), "reasoning_content": think_answer},
    ]
    return messages, tools, think_call, target_tool


def _reasoning_for(prompt: general.GeneralPrompt) -> str:
    """A short reasoning block for a general chat: the request and its rules, in words."""
    rules = {
        "change_case:english_lowercase": lambda k: "all lowercase",
        "change_case:english_capital": lambda k: "all capital letters",
        "punctuation:no_comma": lambda k: "no commas",
        "keywords:existence": lambda k: "use the words " + " and ".join(k["keywords"]),
        "keywords:forbidden_words": lambda k: "avoid the words " + " and ".join(k["forbidden_words"]),
        "startend:end_checker": lambda k: f'end with "{k["end_phrase"]}"',
        "startend:quotation": lambda k: "wrap it in double quotes",
        "detectable_format:number_bullet_lists": lambda k: f"exactly {k['num_bullets']} bullet points",
        "length_constraints:number_words": lambda k: f"{k['relation']} {k['num_words']} words",
        "length_constraints:number_sentences": lambda k: f"{k['relation']} {k['num_sentences']} sentences",
        "combination:repeat_prompt": lambda k: "repeat the request first",
        "detectable_content:postscript": lambda k: f"add a postscript starting with {k['postscript_marker']}",
    }
    parts = [rules[i](k) for i, k in zip(prompt.instruction_id_list, prompt.kwargs, strict=True)]
    return f"A short answer about {general.prompt_topic(prompt.prompt)}. Rules: " + "; ".join(parts) + "."


def _general_chat(prompt: general.GeneralPrompt, rng: random.Random) -> list[dict[str, Any]]:
    """A general instruction-following chat: optional system line, the prompt, the rule-based answer."""
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": "You are a helpful assistant."})
    messages.append({"role": "user", "content": prompt.prompt})
    messages.append(
        {
            "role": "assistant",
            "content": general.general_response(prompt, rng),
            "reasoning_content": _reasoning_for(prompt),
        }
    )
    return messages


def reading_chat_count(n: int, reading_share: float) -> int:
    """How many of `pretraining_chats(n, ..., reading_share=...)`'s chats are reading exercises (the last ones)."""
    return round(n * reading_share)


def pretraining_chats(
    n: int,
    seed: int,
    *,
    general_share: float = 0.35,
    zh_share: float = 0.3,
    reading_share: float = 0.0,
    reading_kinds: Sequence[str] = READING_KINDS,
    reading_symbols: Sequence[str] = (),
    name_pieces: Sequence[str] = NAME_PIECES,
    styles: Sequence[str] = TRAIN_NAMING_STYLES,
    layouts: Sequence[str] = SYSTEM_LAYOUTS,
) -> list[tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    """The tiny base model's pretraining chats, deterministic per seed.

    Args:
      n: number of chats (>= 0).
      seed: sampling seed.
      general_share: share of general instruction-following chats (train split of `general.py`);
        the rest are tool-use chats in other domains under random harnesses.
      zh_share: share of tool-use chats written in Chinese.
      reading_share: share of the n chats that are reading exercises (`hat_jax.data.reading.reading_chats`,
        seeded by `seed`, half of them Chinese, after the other chats: `reading_chat_count`); general_share
        splits the rest. reading_kinds: the exercises' kinds (a non-empty subset of `hat_jax.data.reading.KINDS`);
        reading_symbols: their vocabulary symbols (`reading_chats(symbols=...)`).
      name_pieces: word pieces of tool names (>= 6); styles: naming styles (subset of NAMING_STYLES);
        layouts: system-prompt layouts (subset of SYSTEM_LAYOUTS). The defaults are HSA's training
        styles and layouts, never its held-out families.
    Returns:
      [(messages, tools)]: OpenAI-format messages and OpenAI tool dicts ([] for general chats), so
      `tokenizer.apply_chat_template(messages, tools=tools or None)` renders each.
    Raises:
      ValueError: negative n, shares outside [0, 1], too few pieces, unknown style, layout or reading kind.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    for label, share in (("general_share", general_share), ("zh_share", zh_share), ("reading_share", reading_share)):
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"{label} must be in [0, 1], got {share}")
    if len(set(name_pieces)) < 6:
        raise ValueError(f"name_pieces needs at least 6 distinct pieces, got {len(set(name_pieces))}")
    for label, chosen, known in (("styles", styles, NAMING_STYLES), ("layouts", layouts, SYSTEM_LAYOUTS)):
        bad = [s for s in chosen if s not in known] or ([] if chosen else ["(empty)"])
        if bad:
            raise ValueError(f"{label}: unknown {bad} (expected a non-empty subset of {known})")
    n_reading = reading_chat_count(n, reading_share)
    rng = random.Random(f"corpus-{seed}")
    kinds = [rng.random() < general_share for _ in range(n - n_reading)]
    prompts = iter(general.general_prompts(sum(kinds), seed, split="train"))
    out: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = []
    for is_general in kinds:
        if is_general:
            out.append((_general_chat(next(prompts), rng), []))
        else:
            messages, tools, _, _ = _tool_chat(rng, name_pieces, styles, layouts, zh_share)
            out.append((messages, tools))
    return out + reading_chats(n_reading, seed, kinds=reading_kinds, symbols=reading_symbols)


def render_chat(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, *, add_generation_prompt: bool = False
) -> str:
    """The chat as text through hat-jax's chat template, without a tokenizer.

    Equals `tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
    add_generation_prompt=...)` for a tokenizer carrying `chat_template.jinja` (tested).
    """
    rendered, _ = render_jinja_template(
        [messages], tools=tools or None, chat_template=read_chat_template(), add_generation_prompt=add_generation_prompt
    )
    return rendered[0]


def tokenizer_training_texts(n: int, seed: int, extra_texts: Iterable[str] = ()) -> list[str]:
    """Texts to train the tiny BPE on: `n` rendered pretraining chats, then `extra_texts`.

    Args:
      n: number of pretraining chats to render.
      seed: corpus seed.
      extra_texts: caller texts (catalog, harness, viewer messages...), so the live-stream world's
        Chinese and names are covered without putting them in the corpus.
    Returns:
      the list of texts.
    """
    texts = [render_chat(messages, tools) for messages, tools in pretraining_chats(n, seed)]
    return texts + [str(t) for t in extra_texts]


def recall_probe(
    n: int,
    seed: int,
    *,
    zh_share: float = 0.3,
    name_pieces: Sequence[str] = NAME_PIECES,
    styles: Sequence[str] = TRAIN_NAMING_STYLES,
    layouts: Sequence[str] = SYSTEM_LAYOUTS,
) -> list[RecallProbe]:
    """`n` recall probes: fresh tool chats cut just before the tool name (see `RecallProbe`).

    Seeded apart from `pretraining_chats` (a probe is not a training chat of the same seed).

    Raises:
      ValueError: negative n.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(f"recall-probe-{seed}")
    probes = []
    for _ in range(n):
        messages, tools, think_call, name = _tool_chat(rng, name_pieces, styles, layouts, zh_share)
        prefix = think_call + "\n</think>\n\n<tool_call>\n<function="
        probes.append(RecallProbe(messages=messages[:2], tools=tools, assistant_prefix=prefix, expected_name=name))
    return probes
