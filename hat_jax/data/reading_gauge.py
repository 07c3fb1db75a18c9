"""The harness-reading gauge's rows: a tool list, a request, the call of the tool the list names for it.

The pure form of what HAT asks of the model (associative recall through the chat format): the system message
lists `n_tools` intents, each with the name of the tool that serves it; the user asks for one of them by its
label; the assistant's whole turn is the call `<tool_call><function=NAME>` of that intent's tool, in the
project's chat format and tokenizer (`hat_jax.tokenizer.chat_encoding`), so BPE segmentation of the names and
the format's overhead are part of what is measured. Names come in three families:

- "fixed": every intent always has its world name (`get_price`): a model can memorise them;
- "renamed": names drawn fresh for every row from HSA's training families (`TRAIN_TOOL_STYLES`, combinations
  not reserved), so only reading the list gives the answer;
- "heldout": HSA's held-out families (`HELDOUT_TOOL_STYLES`, reserved combinations), never trained on;
- "anystyle" (a training family, not scored): every style, HSA's held-out ones included, on combinations that are
  not reserved: the names a pretrained base has read, as the base's reading exercises write them
  (`hat_jax.data.reading`). Training on it asks whether a model that has written the held-out styles copies
  held-out names (reserved combinations) it never saw.

The score of a row is exact: every token of the called name is the model's argmax under teacher forcing.
The same construction as the harness-recall probe of ../shared/probes (token ids there, the chat format here).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np

from hat_jax.harness.hsa_vocab import HELDOUT_TOOL_STYLES, TRAIN_TOOL_STYLES, sample_tool_name
from hat_jax.tokenizer import chat_encoding

FAMILIES = ("fixed", "renamed", "heldout")  # scored
TRAIN_FAMILIES = (*FAMILIES, "anystyle")
# how a list entry is written: "- label: name" (the answer follows what the request matches, as in the token-id
# probe) or "- name: label" (the answer precedes it, as in a harness: a tool's or skill's name comes before its
# description in the chat template's tool block and in every system-prompt layout)
ORDERS = ("label_first", "name_first")
# world tool -> the viewer-facing label the list and the request use
INTENT_LABELS: dict[str, str] = {
    "search_products": "搜索商品",
    "get_product_detail": "商品详情",
    "get_price": "查询价格",
    "get_stock": "查询库存",
    "get_promotions": "优惠活动",
    "estimate_shipping": "运费时效",
    "get_size_chart": "尺码表",
    "get_after_sales_policy": "售后政策",
}


def tool_names(intents: Sequence[str], family: str, rng: random.Random) -> dict[str, str]:
    """{intent: tool name} for one row, distinct names, drawn as the family says (module docstring).

    Raises:
        ValueError: an unknown family or intent.
    """
    if family not in TRAIN_FAMILIES:
        raise ValueError(f"reading gauge family {family!r}: expected one of {TRAIN_FAMILIES}")
    unknown = [i for i in intents if i not in INTENT_LABELS]
    if unknown:
        raise ValueError(f"reading gauge intents {unknown}: expected world tools {sorted(INTENT_LABELS)}")
    if family == "fixed":
        return {i: i for i in intents}
    styles, heldout = {"renamed": (TRAIN_TOOL_STYLES, False), "heldout": (HELDOUT_TOOL_STYLES, True),
                       "anystyle": (TRAIN_TOOL_STYLES + HELDOUT_TOOL_STYLES, False)}[family]
    taken: set[str] = set()
    out = {}
    for intent in intents:
        out[intent] = sample_tool_name(intent, rng.choice(styles), rng, heldout=heldout, taken=taken)
        taken.add(out[intent])
    return out


def gauge_messages(rng: random.Random, family: str, n_tools: int = 5,
                   order: str = "label_first") -> tuple[list[dict], str]:
    """(OpenAI-format messages of one row, the name the assistant calls): `n_tools` of the world's intents in a
    random order with their names (each entry written as `order` says, see ORDERS), the request naming one of
    them, the assistant's call.

    Raises:
        ValueError: an unknown family or order; n_tools outside 1..len(INTENT_LABELS).
    """
    if not 1 <= n_tools <= len(INTENT_LABELS):
        raise ValueError(f"reading gauge n_tools={n_tools}: expected 1..{len(INTENT_LABELS)}")
    if order not in ORDERS:
        raise ValueError(f"reading gauge order {order!r}: expected one of {ORDERS}")
    intents = rng.sample(sorted(INTENT_LABELS), n_tools)
    names = tool_names(intents, family, rng)
    asked = rng.choice(intents)
    pairs = [(INTENT_LABELS[i], names[i]) if order == "label_first" else (names[i], INTENT_LABELS[i]) for i in intents]
    listing = "\n".join(f"- {a}: {b}" for a, b in pairs)
    messages = [{"role": "system", "content": f"工具列表：\n{listing}\n按用户的需求调用对应的工具。"},
                {"role": "user", "content": INTENT_LABELS[asked]},
                {"role": "assistant", "content": "",
                 "tool_calls": [{"type": "function", "function": {"name": names[asked], "arguments": {}}}]}]
    return messages, names[asked]


def encode_row(tokenizer, messages: list[dict], name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(input_ids [T] int32, loss_mask [T] int32: the assistant turn's tokens, name_mask [T] int32: the tokens
    that overlap the called name in the assistant turn). Rendered without reasoning (`enable_thinking=False`).

    Raises:
        ValueError: the name is not found in the assistant turn (a template that does not render tool calls).
    """
    enc = chat_encoding(tokenizer, messages, enable_thinking=False)
    prompt = chat_encoding(tokenizer, messages[:-1], add_generation_prompt=True, enable_thinking=False)
    start = len(prompt.text)
    at = enc.text.find(name, start)
    if at < 0:
        raise ValueError(f"reading gauge: tool name {name!r} not rendered in the assistant turn of {enc.text!r}")
    ids = np.asarray(enc.ids, np.int32)
    loss = np.asarray([s >= start for s, _ in enc.offsets], np.int32)
    named = np.asarray([s < at + len(name) and e > at for s, e in enc.offsets], np.int32)
    return ids, loss, named


def gauge_batch(tokenizer, rng: random.Random, family: str | Sequence[str], batch: int, width: int,
                n_tools: int = 5, order: str = "label_first") -> dict[str, np.ndarray]:
    """`batch` right-padded rows of `width` tokens: {input_ids, attention_mask, loss_mask, name_mask} [batch, width]
    int32. `family` may be a sequence: each row draws its family from it (a mixed training batch).

    Raises:
        ValueError: a row longer than `width` (names the length), or as `gauge_messages`.
    """
    families = (family,) if isinstance(family, str) else tuple(family)
    out = {k: np.zeros((batch, width), np.int32) for k in ("input_ids", "attention_mask", "loss_mask", "name_mask")}
    out["input_ids"][:] = tokenizer.pad_token_id
    for r in range(batch):
        ids, loss, named = encode_row(tokenizer, *gauge_messages(rng, rng.choice(families), n_tools, order))
        if len(ids) > width:
            raise ValueError(f"reading gauge row of {len(ids)} tokens > width {width}: raise --width")
        n = len(ids)
        out["input_ids"][r, :n], out["attention_mask"][r, :n] = ids, 1
        out["loss_mask"][r, :n], out["name_mask"][r, :n] = loss, named
    return out


def listed_names(messages: list[dict], order: str = "label_first") -> list[str]:
    """The tool names a `gauge_messages` row lists, in its order (parsed from the system message)."""
    entries = [line[2:].split(": ", 1) for line in messages[0]["content"].splitlines() if line.startswith("- ")]
    return [e[1] if order == "label_first" else e[0] for e in entries]


def first_token_chance(tokenizer, rng: random.Random, family: str, rows: int, n_tools: int = 5,
                       order: str = "label_first") -> float:
    """The share of rows whose name's first token a model gets right by calling one of the listed tools at random:
    per row, the listed names whose first token as the call writes it (`encode_row`'s first name token) is the
    answer's, over n_tools; averaged over `rows` rows drawn as `gauge_batch(tokenizer, rng, family, rows, ...)`
    draws them (the same rng state gives the same rows). Above 1 / n_tools where names of a row share a first
    piece. The floor that `name_token_hits`' first share is read against.

    Raises:
        ValueError: as `gauge_messages`.
    """
    shares = []
    for _ in range(rows):
        messages, name = gauge_messages(rng, rng.choice((family,)), n_tools, order)

        def first_token(called: str) -> int:
            call = {**messages[-1], "tool_calls": [{"type": "function", "function": {"name": called, "arguments": {}}}]}
            ids, _, named = encode_row(tokenizer, [*messages[:-1], call], called)
            return int(ids[int(np.argmax(named))])

        firsts = [first_token(n) for n in listed_names(messages, order)]
        shares.append(firsts.count(first_token(name)) / len(firsts))
    return float(np.mean(shares))


def exact_names(logits_argmax: np.ndarray, input_ids: np.ndarray, name_mask: np.ndarray) -> np.ndarray:
    """[B] bool: every name token of the row is the argmax of the position before it (teacher forcing).

    Args:
        logits_argmax: [B, T] int, position t's argmax (a guess of token t+1). input_ids, name_mask: [B, T].
    """
    first, rest = name_token_hits(logits_argmax, input_ids, name_mask)
    return first & rest


def name_token_hits(logits_argmax: np.ndarray, input_ids: np.ndarray,
                    name_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first [B] bool, rest [B] bool): the name's first token is the argmax of the position before it; every
    later name token is (teacher forcing, so each position is scored on the gold prefix and `exact_names` is
    first & rest). A row with a one-token name has rest True; a row without a name token has both False. Splits
    an exact miss into finding the entry (the first token) and copying the rest of its name.

    Args:
        logits_argmax: [B, T] int, position t's argmax (a guess of token t+1). input_ids, name_mask: [B, T].
    """
    hit = logits_argmax[:, :-1] == input_ids[:, 1:]
    need = name_mask[:, 1:].astype(bool)
    has = need.any(axis=1)
    first_at = np.argmax(need, axis=1)
    first = has & hit[np.arange(len(hit)), first_at]
    later = need.copy()
    later[np.arange(len(need)), first_at] = False
    rest = has & np.all(hit | ~later, axis=1)
    return first, rest
