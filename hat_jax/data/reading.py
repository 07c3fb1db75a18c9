"""Reading exercises for the tiny base's pretraining: short chats whose answers are copied from the context.

Variant implemented and why: reading a harness is associative recall (find the entry a request points to, copy
the name written beside it), a skill a pretrained LLM brings and a from-scratch tiny base lacks (its recall
probe stayed at 0 on tool chats of ~770 tokens with one copied name each). These chats are short (~60-350 tokens;
`tools` ~700, most of it the chat template's tool block) and dense: every chat asks 2-5 questions whose answers
are spans of the context, so most of their tokens after the listing are reading decisions. Ten kinds, none
with live-stream or shopping content:

- "lookup": a table of keys and values (lines, `=` pairs, a JSON object or a markdown table); questions name a
  key, the answer is its value;
- "record": a JSON record; questions name a field, the answer is its value;
- "copy": strings to repeat exactly;
- "select": entries with a name and a description; requests give the description (or its gist), the answer
  is the entry's name;
- "call": a tool list in the system message (name and description, as a harness lists them); requests give
  the description or its gist; the assistant calls the listed tool (`tool_calls`), the tool message returns
  a record and the reply copies its value;
- "label": as "call", but the list gives each tool a short label and the request is that label verbatim: the
  match is exact, so finding the entry is pure recall (the form of the reading gauge, generic content);
- "tools": as "call", in the surface of a harness: the tools are the chat template's tool definitions (its
  `# Tools` block, where a harness's MCP tools reach the model), listed again in the system message in half of
  the chats, and each call's reasoning names the request and the description it matched before the call (the
  form of the pretraining tool chats and of the recall probe, short and with generic tasks);
- "results": a search, then a fetch by id, in the form of a harness's tool results (two rounds; the tools listed
  in the system message): the user asks for a field of an item by its name, wrapped in a greeting or a purchase
  as a viewer's message wraps it; in half of the chats the assistant first calls a guide tool whose result (the
  steps) stands between the request and the search, as a loaded skill does; it searches with the item's name (a
  copy from the request, past that result), the tool returns a JSON list of items that share the brand or the
  object, with ids of one letter and four digits (the match first in about 4 of 5), the assistant fetches the
  match by its id (a copy of digits among ids that share their first tokens) and replies with the field's value
  from the record (a copy from a JSON record). Items are generic objects (a fresh brand, an attribute, an
  object), so a query can be copied but not recalled.
- "arguments": as "tools" (the tools only in the chat template's tool block), each tool with one parameter whose
  key is a fresh name in any argument style (snake_case, camelCase, PascalCase); a request gives the task and the
  value to pass, and the call writes the value under the key that the chosen tool's schema declares (the answer
  scored is the key: a renamed harness renames its tools' arguments too);
- "query": the search alone, dense: 4-6 requests of the "results" kind in a chat, each answered by the search
  call with the item's name (the tool returns only a count), so that finding where a wrapped name starts is a
  decision of every ~40 tokens instead of every ~400.

Names are 1-3 word pieces from a broad pool (generic English, pinyin and the English words of HSA's tool and
skill vocabulary, as a real base has seen them all) in every naming style, HSA's held-out ones included: a
pretrained base has read dotted and PascalCase names, while HSA-SFT and RL still never train on HSA's
held-out families (`hat_jax.harness.hsa_vocab`). Source: the associative-recall probe of ../shared/probes
(names drawn fresh per row are learned, a fixed set is memorised) and the multi-query associative recall
tasks of Zoology (Arora et al. 2023, arXiv 2312.04927).
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
from collections.abc import Iterator, Sequence

import numpy as np

from hat_jax.data.corpus_domains import BOOKS, CITIES, CONDITIONS, DISHES, DOMAINS, FOODS, STATIONS
from hat_jax.harness import hsa_vocab

KINDS: tuple[str, ...] = ("lookup", "record", "copy", "select", "call", "label", "tools", "results", "query",
                          "arguments")
NAME_STYLES: tuple[str, ...] = hsa_vocab.TRAIN_TOOL_STYLES + hsa_vocab.HELDOUT_TOOL_STYLES
ARG_STYLES: tuple[str, ...] = hsa_vocab.TRAIN_ARG_STYLES + hsa_vocab.HELDOUT_ARG_STYLES
_GENERIC_PIECES: tuple[str, ...] = (
    "get", "set", "find", "list", "load", "read", "show", "calc", "run", "send", "make", "open", "sync", "scan",
    "info", "data", "item", "record", "entry", "status", "report", "detail", "meta", "value", "index", "table",
    "node", "task", "job", "box", "tool", "kit", "hub", "desk", "port", "link", "map", "log", "spec", "view",
    "user", "file", "note", "time", "date", "city", "book", "train", "room", "card", "code", "plan", "team",
    "shu", "ju", "xin", "xi", "wen", "jian", "ri", "qi", "di", "zhi", "ming", "cheng", "biao", "dan", "hao",
)  # fmt: skip


def name_pieces() -> tuple[str, ...]:
    """The word pieces of the exercises' names: generic pieces and the pieces of HSA's vocabulary, deduplicated
    in a fixed order."""
    hsa = list(hsa_vocab.VERBS) + list(hsa_vocab.PREFIXES)
    for table in (hsa_vocab.TOOL_NOUNS, hsa_vocab.SKILL_NOUNS, hsa_vocab.ARG_NOUNS):
        hsa += [p for variants in table.values() for v in variants for p in v]
    return tuple(dict.fromkeys(list(_GENERIC_PIECES) + hsa))


# Generic tasks (English|Chinese description, English|Chinese gist) beside the corpus domains' intents.
_TASKS: tuple[tuple[str, str, str, str], ...] = (
    ("Translates a sentence into another language.", "把一句话翻译成另一种语言。", "a translation", "翻译"),
    ("Sends an email to a contact.", "给联系人发送一封邮件。", "sending an email", "发邮件"),
    ("Sets an alarm for a given time.", "在指定时间设置闹钟。", "an alarm", "设闹钟"),
    ("Returns the current exchange rate of two currencies.", "查询两种货币的当前汇率。", "an exchange rate", "汇率"),
    ("Books a meeting room for an hour.", "预订一间会议室一小时。", "a meeting room", "订会议室"),
    ("Returns the opening hours of a museum.", "查询博物馆的开放时间。", "opening hours", "开放时间"),
    ("Counts the words in a text.", "统计一段文字的字数。", "a word count", "字数"),
    ("Returns the phone number of a contact.", "查询联系人的电话号码。", "a phone number", "电话号码"),
    ("Creates a note with a title.", "新建一条带标题的笔记。", "a new note", "新建笔记"),
    ("Returns the population of a city.", "查询一个城市的人口。", "the population", "人口"),
    ("Returns the time zone of a city.", "查询一个城市所在的时区。", "a time zone", "时区"),
    ("Plays a song by its title.", "按歌名播放一首歌。", "playing a song", "播放歌曲"),
    ("Returns the distance between two addresses.", "查询两个地址之间的距离。", "the distance between two places", "两地距离"),
    ("Returns the balance of a bank account.", "查询银行账户余额。", "an account balance", "账户余额"),
    ("Adds a task to a to-do list.", "把一项任务加入待办清单。", "a to-do item", "待办事项"),
    ("Returns the definition of a word.", "查询一个词的释义。", "a definition", "词义"),
)  # fmt: skip


def _tasks() -> list[dict[str, dict[str, str]]]:
    """Every task a select/call exercise can list: {"desc": {en, zh}, "gist": {en, zh}}."""
    out = [{"desc": dict(i.desc), "gist": dict(i.gist)} for d in DOMAINS for i in d.intents]
    out += [{"desc": {"en": de, "zh": dz}, "gist": {"en": ge, "zh": gz}} for de, dz, ge, gz in _TASKS]
    return out


TASKS = _tasks()
_WORDS = [w for pairs in (CITIES, FOODS, BOOKS, STATIONS, DISHES, CONDITIONS) for pair in pairs for w in pair]


def random_name(rng: random.Random, pieces: Sequence[str], styles: Sequence[str] = NAME_STYLES) -> str:
    """A name of 1-3 pieces (2-3 for dotted: a namespace and a name) in one of `styles`."""
    style = rng.choice(list(styles))
    k = rng.randint(2, 3) if style == "dotted" else rng.randint(1, 3)
    return hsa_vocab.style_name(rng.sample(list(pieces), k), style)


def _distinct(k: int, draw) -> list[str]:
    out: list[str] = []
    while len(out) < k:
        value = draw()
        if value not in out:
            out.append(value)
    return out


def random_value(rng: random.Random, pieces: Sequence[str]) -> str:
    """A value to copy: a number, a code, a word of the corpus worlds (English or Chinese) or a name."""
    kind = rng.randrange(4)
    if kind == 0:
        return str(rng.randint(0, 9999))
    if kind == 1:
        return f"{rng.choice('ABCDEFGHJKMNPQRSTUVWXYZ')}{rng.randint(10, 999)}"
    if kind == 2:
        return rng.choice(_WORDS)
    return random_name(rng, pieces)


_ASK = {
    "lookup": {"en": ("What is the value of {k}?", "{k}?", "Look up {k}."), "zh": ("{k} 的值是多少？", "{k}？", "查一下 {k}。")},
    "record": {"en": ("What is the {k} field?", "Give me {k}.", "{k}?"), "zh": ("{k} 字段是什么？", "告诉我 {k}。", "{k}？")},
    "copy": {"en": ("Repeat exactly: {k}", "Copy this: {k}"), "zh": ("原样重复：{k}", "照抄：{k}")},
    "select": {"en": ("Which entry is for {k}?", "I need {k}.", "{k}"), "zh": ("哪一项用于{k}？", "我需要{k}。", "{k}")},
}  # fmt: skip


def _layout_table(rng: random.Random, rows: list[tuple[str, str]]) -> str:
    """Key-value rows in one of four layouts."""
    layout = rng.randrange(4)
    if layout == 0:
        return "\n".join(f"{k}: {v}" for k, v in rows)
    if layout == 1:
        return "; ".join(f"{k} = {v}" for k, v in rows)
    if layout == 2:
        return json.dumps(dict(rows), ensure_ascii=False)
    return "| key | value |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)


def _qa_turns(rng: random.Random, kind: str, lang: str, pairs: list[tuple[str, str]], n: int) -> list[dict]:
    """n user questions about distinct keys of `pairs` ((key shown in the question, answer)), each answered."""
    out = []
    for key, answer in rng.sample(pairs, min(n, len(pairs))):
        out.append({"role": "user", "content": rng.choice(_ASK[kind][lang]).format(k=key)})
        out.append({"role": "assistant", "content": answer})
    return out


def _lookup_chat(rng, lang, pieces) -> list[dict]:
    keys = _distinct(rng.randint(4, 8), lambda: random_name(rng, pieces))
    rows = [(k, random_value(rng, pieces)) for k in keys]
    head = "Table:" if lang == "en" else "数据表："
    first = {"role": "user", "content": f"{head}\n{_layout_table(rng, rows)}"}
    turns = _qa_turns(rng, "lookup", lang, rows, rng.randint(3, 5))
    turns[0] = {"role": "user", "content": first["content"] + "\n\n" + turns[0]["content"]}
    return turns


def _record_chat(rng, lang, pieces) -> list[dict]:
    fields = _distinct(rng.randint(3, 6), lambda: random_name(rng, pieces, hsa_vocab.TRAIN_ARG_STYLES))
    record = {f: random_value(rng, pieces) for f in fields}
    system = {"role": "system", "content": ("Record: " if lang == "en" else "记录：")
              + json.dumps(record, ensure_ascii=False)}
    return [system] + _qa_turns(rng, "record", lang, list(record.items()), rng.randint(2, 4))


def _copy_chat(rng, lang, pieces, pools) -> list[dict]:
    def part() -> str:
        if pools[lang] and rng.random() < 0.5:  # 1-3 tokens of the vocabulary (`token_symbols`)
            return ("" if lang == "zh" else " ").join(rng.choices(pools[lang], k=rng.randint(1, 3)))
        return random_name(rng, pieces) if rng.random() < 0.7 else random_value(rng, pieces)

    strings = [" ".join(part() for _ in range(rng.randint(1, 3))) for _ in range(rng.randint(2, 4))]
    return _qa_turns(rng, "copy", lang, [(s, s) for s in strings], len(strings))


def _listing(rng: random.Random, entries: list[tuple[str, str]], lang: str) -> str:
    """Entries (name, description) listed in one of four layouts, in the given order: two with the description first
    (`- d: n`, and `- d -> n` as the compact harness lists its skills), two with the name first."""
    layout = rng.randrange(4)
    if layout == 0:
        return "\n".join(f"- {d}: {n}" for n, d in entries)
    if layout == 1:
        return "\n".join(f"{n} - {d}" for n, d in entries)
    if layout == 2:
        return "\n".join(f"- {d} -> {n}" for n, d in entries)
    return "\n".join(f'<tool name="{n}">{d}</tool>' for n, d in entries)


def _pick_tasks(rng: random.Random, pieces, lang: str) -> tuple[list[tuple[str, dict]], list[tuple[str, str]]]:
    """([(name, task)], [(name, description)]): 4-8 tasks with fresh distinct names."""
    tasks = rng.sample(TASKS, rng.randint(4, 8))
    names = _distinct(len(tasks), lambda: random_name(rng, pieces))
    return list(zip(names, tasks)), [(n, t["desc"][lang]) for n, t in zip(names, tasks)]


def _request(rng: random.Random, task: dict, lang: str) -> str:
    return task["gist" if rng.random() < 0.5 else "desc"][lang].rstrip(".。")


def _select_chat(rng, lang, pieces) -> list[dict]:
    named, entries = _pick_tasks(rng, pieces, lang)
    head = "Entries:" if lang == "en" else "条目："
    system = {"role": "system", "content": f"{head}\n{_listing(rng, entries, lang)}"}
    pairs = [(_request(rng, task, lang), name) for name, task in named]
    return [system] + _qa_turns(rng, "select", lang, pairs, rng.randint(3, 4))


def _call_chat(rng, lang, pieces, *, by_label: bool = False) -> list[dict]:
    named, entries = _pick_tasks(rng, pieces, lang)
    if by_label:  # the listing shows each task's gist, and the request repeats it
        entries = [(n, t["gist"][lang]) for n, t in named]
    rule = "Call the tool that serves the request." if lang == "en" else "按用户的需求调用对应的工具。"
    head = "Tools:" if lang == "en" else "工具列表："
    messages = [{"role": "system", "content": f"{head}\n{_listing(rng, entries, lang)}\n{rule}"}]
    for name, task in rng.sample(named, rng.randint(2, 3)):
        field = random_name(rng, pieces, hsa_vocab.TRAIN_ARG_STYLES)
        value = random_value(rng, pieces)
        request = task["gist"][lang] if by_label else _request(rng, task, lang)
        messages += _call_turns(request, name, field, value)
    return messages


def _call_turns(request: str, name: str, field: str, value: str, reasoning: str | None = None) -> list[dict]:
    """A request, the assistant's call of `name` (with its reasoning), the tool's record {field: value} and the
    reply that copies the value."""
    return [{"role": "user", "content": request}, _call(name, {}, reasoning),
            {"role": "tool", "name": name, "content": json.dumps({field: value}, ensure_ascii=False)},
            {"role": "assistant", "content": value}]


def _label_chat(rng, lang, pieces) -> list[dict]:
    return _call_chat(rng, lang, pieces, by_label=True)


def _match_reasoning(task: dict, lang: str) -> str:
    """A call's reasoning: the request's gist and the tool description it matched."""
    gist, desc = task["gist"][lang], task["desc"][lang]
    return (f'The user asks for {gist}. The tool described as "{desc}" fits.' if lang == "en"
            else f"用户想知道:{gist}。描述为「{desc}」的工具正合适。")


def _tools_chat(rng, lang, pieces) -> tuple[list[dict], list[dict]]:
    named, entries = _pick_tasks(rng, pieces, lang)
    tools = [{"type": "function", "function": {"name": n, "description": d,
                                               "parameters": {"type": "object", "properties": {}}}}
             for n, d in entries]
    system = "You are a helpful assistant." if lang == "en" else "你是一个有用的助手。"
    if rng.random() < 0.5:
        system += "\n" + ("Tools:" if lang == "en" else "工具列表：") + "\n" + _listing(rng, entries, lang)
    messages = [{"role": "system", "content": system}]
    for name, task in rng.sample(named, rng.randint(2, 3)):
        field, value = random_name(rng, pieces, hsa_vocab.TRAIN_ARG_STYLES), random_value(rng, pieces)
        think = _match_reasoning(task, lang)
        messages += _call_turns(_request(rng, task, lang), name, field, value, think)
    return messages, tools


_ARGUMENT_TEXT = {
    "en": {"param": "The input of the task.", "ask": ("{r}: {v}", "{r}, for {v}", "{r} ({v})", "{v}: {r}")},
    "zh": {"param": "任务的输入。", "ask": ("{r}：{v}", "{r}，对象是 {v}", "{r}（{v}）", "{v}：{r}")},
}


def _arguments_chat(rng, lang, pieces) -> tuple[list[dict], list[dict]]:
    named, entries = _pick_tasks(rng, pieces, lang)
    names = [n for n, _ in named]

    def key() -> str:  # never one of the chat's tool names: the key is read from the schema, not the name
        return next(k for k in iter(lambda: random_name(rng, pieces, ARG_STYLES), None) if k not in names)

    keys = dict(zip(names, _distinct(len(names), key)))
    text = _ARGUMENT_TEXT[lang]
    tools = [{"type": "function", "function": {
        "name": n, "description": d, "parameters": {
            "type": "object", "properties": {keys[n]: {"type": "string", "description": text["param"]}},
            "required": [keys[n]]}}} for n, d in entries]
    messages = [{"role": "system", "content": "You are a helpful assistant." if lang == "en" else "你是一个有用的助手。"}]
    for name, task in rng.sample(named, rng.randint(2, 3)):
        value, field = random_value(rng, pieces), random_name(rng, pieces, hsa_vocab.TRAIN_ARG_STYLES)
        think = _match_reasoning(task, lang)
        call = {**_call(name, {keys[name]: value}, think), KEY_ANSWER: True}
        messages += [{"role": "user", "content": rng.choice(text["ask"]).format(r=_request(rng, task, lang), v=value)},
                     call, {"role": "tool", "name": name, "content": json.dumps({field: value}, ensure_ascii=False)},
                     {"role": "assistant", "content": value}]
    return messages, tools


# The "results" kind's registry: an item is a brand, an attribute and an object (`_item`). Brands are drawn fresh
# (two characters of `_BRAND_CHARS`, or one or two capitalised word pieces) so that a query can only be copied,
# not recalled; a request wraps the item's name in a greeting or a purchase (`ask`), as a viewer's message does.
_BRAND_CHARS = "云山海风月星竹松花雪晨夕春秋青白金石林川溪岚安和乐禾木森田野光南北东西红蓝绿紫栗梅兰菊桃李"
_ATTRIBUTES = (("vintage", "复古"), ("large", "大号"), ("quiet", "静音"), ("portable", "便携"), ("thick", "加厚"),
               ("simple", "简约"), ("waterproof", "防水"), ("insulated", "保温"), ("foldable", "折叠"),
               ("mini", "迷你"))
_OBJECTS = (("backpack", "背包"), ("map", "地图"), ("towel", "毛巾"), ("gloves", "手套"), ("schoolbag", "书包"),
            ("keyboard", "键盘"), ("mouse", "鼠标"), ("wallet", "钱包"), ("headphones", "耳机"), ("umbrella", "伞"),
            ("pot", "锅"), ("basin", "盆"), ("lamp", "台灯"), ("cup", "杯子"), ("notebook", "笔记本"),
            ("chair", "椅子"), ("kettle", "水壶"), ("blanket", "毯子"), ("pillow", "枕头"), ("bottle", "瓶子"),
            ("clock", "时钟"), ("pen", "钢笔"), ("scarf", "围巾"), ("speaker", "音箱"))
_FIELDS = (("weight", "重量"), ("year", "年份"), ("stock", "库存"), ("rating", "评分"), ("length", "长度"),
           ("price", "价格"), ("width", "宽度"), ("floor", "楼层"))
_RESULTS_TEXT = {
    "en": {"search": "Finds items by name.", "fetch": "Returns an item's record by its id.",
           "guide": "Returns the steps for answering a question about an item.",
           "ask": ("What is the {f} of the {q}?", "{q}: {f}?", "Tell me the {f} of the {q}.",
                   "Hi, what is the {f} of the {q}?", "Quick question: the {q}, what is its {f}?",
                   "I want to buy the {q}; what is its {f}?", "Could you check the {f} of the {q} for me, please?",
                   "Hello! How about the {f} of the {q} today?"),
           "steps": "Search the name with `{s}`, then fetch the record by its id with `{g}`.",
           "read": "First read the steps, with {t}.",
           "find": "First find the item's id, with {t}.", "get": "Then its {f}, with {t}."},
    "zh": {"search": "按名称查找物品。", "fetch": "按编号查询物品的记录。", "guide": "返回回答物品问题的步骤。",
           "ask": ("{q}的{f}是多少？", "{q}，{f}？", "问一下{q}的{f}。", "你好，{q}的{f}是多少呀？",
                   "请问一下，{q}的{f}是多少", "我想买{q}，它的{f}是多少？", "帮我查查{q}的{f}，谢谢",
                   "麻烦看看{q}今天的{f}"),
           "steps": "先用 `{s}` 按名称搜索，再用 `{g}` 按编号查记录。",
           "read": "先看步骤，用{t}。",
           "find": "先找物品编号，用{t}。", "get": "查{f}，用{t}。"},
}


def _brand(rng: random.Random, lang: str, pools: _SymbolPools) -> str:
    """A fresh brand: one token of the tokenizer's vocabulary (`pools`, `token_symbols`) when it has some in
    `lang` (two when the vocabulary is character-level in Chinese, `pools.zh_chars`: a brand has two characters
    or more), else two characters of `_BRAND_CHARS` (Chinese) or one or two capitalised generic pieces."""
    if pools[lang]:
        brand = rng.choice(pools[lang])
        return brand + rng.choice(pools[lang]) if lang == "zh" and pools.zh_chars else brand
    if lang == "zh":
        return "".join(rng.sample(_BRAND_CHARS, 2))
    return "".join(rng.sample(_GENERIC_PIECES, rng.randint(1, 2))).capitalize()


def _item(brand: str, attribute: tuple[str, str], obj: tuple[str, str], lang: str) -> tuple[str, str]:
    """(full name, the short name a request may use): "Deskhub vintage map" / "Deskhub map", "云山复古地图" /
    "云山地图"."""
    i = 0 if lang == "en" else 1
    sep = " " if lang == "en" else ""
    return sep.join((brand, attribute[i], obj[i])), sep.join((brand, obj[i]))


def _results_round(rng: random.Random, lang: str, letter: str,
                   pools: _SymbolPools) -> tuple[str, list[tuple[str, str]]]:
    """One round's query and listed [(name, id)]: the asked item first, then 2-3 items that share only its brand
    or only its object, as a search by name ranks them. The query is the item's short name in 7 of 10 rounds,
    else its full name; the request names it verbatim."""
    brand, obj = _brand(rng, lang, pools), rng.choice(_OBJECTS)
    name, short = _item(brand, rng.choice(_ATTRIBUTES), obj, lang)
    listed = [name]
    for other in rng.sample([o for o in _OBJECTS if o != obj], rng.randint(2, 3)):
        if rng.random() < 0.5:  # the asked brand, another object
            listed.append(_item(brand, rng.choice(_ATTRIBUTES), other, lang)[0])
        else:  # another brand, the asked object
            other_brand = next(b for b in iter(lambda: _brand(rng, lang, pools), None) if b != brand)
            listed.append(_item(other_brand, rng.choice(_ATTRIBUTES), obj, lang)[0])
    ids = [f"{letter}{n:04d}" for n in rng.sample(range(1, 300), len(listed))]
    return (short if rng.random() < 0.7 else name), list(zip(listed, ids))


def _tools_system(lang: str, listing: Sequence[str]) -> dict:
    """The system message of the "results" and "query" kinds: a helpful-assistant line, then the tools listed."""
    system = "You are a helpful assistant." if lang == "en" else "你是一个有用的助手。"
    return {"role": "system", "content": "\n".join((system, "Tools:" if lang == "en" else "工具列表：", *listing))}


def _results_chat(rng, lang, pieces, pools) -> list[dict]:
    text = _RESULTS_TEXT[lang]
    search, fetch, guide = _distinct(3, lambda: random_name(rng, pieces))
    taken = {"name", "query", *(f[0] for f in _FIELDS)}  # the id's key is none of the record's other keys
    draw = iter(lambda: random_name(rng, pieces, hsa_vocab.TRAIN_ARG_STYLES), None)
    id_key = next(k for k in draw if k not in taken)
    letter = rng.choice("ABCDEFGHJKMNPQRSTUVWXYZ")
    with_guide = rng.random() < 0.5  # a guide call between the request and the search, as a harness loads a skill
    listing = [f"- {search}(query): {text['search']}", f"- {fetch}({id_key}): {text['fetch']}"]
    if with_guide:
        listing.insert(rng.randint(0, 2), f"- {guide}(): {text['guide']}")
    messages = [_tools_system(lang, listing)]
    for _ in range(2):
        query, listed = _results_round(rng, lang, letter, pools)
        (name, item_id), shown = listed[0], listed[:]
        if rng.random() >= 0.75:
            rng.shuffle(shown)
        fields = rng.sample(_FIELDS, 3)
        record = {id_key: item_id, "name": name}
        for f in fields:
            whole = rng.random() < 0.6
            record[f[0]] = rng.randint(1, 999) if whole else round(rng.uniform(1, 999), rng.choice((1, 2)))
        field = rng.choice(fields)
        label = field[0] if lang == "en" else field[1]
        found = {"query": query, "total": len(shown) + rng.randint(0, 20),
                 "items": [{id_key: i, "name": n} for n, i in shown]}
        messages.append({"role": "user", "content": rng.choice(text["ask"]).format(q=query, f=label)})
        if with_guide:
            messages += [_call(guide, {}, text["read"].format(t=guide)),
                         {"role": "tool", "name": guide, "content": text["steps"].format(s=search, g=fetch)}]
        messages += [
            _call(search, {"query": query}, text["find"].format(t=search)),
            {"role": "tool", "name": search, "content": json.dumps(found, ensure_ascii=False)},
            _call(fetch, {id_key: item_id}, text["get"].format(f=label, t=fetch)),
            {"role": "tool", "name": fetch, "content": json.dumps(record, ensure_ascii=False)},
            {"role": "assistant", "content": json.dumps(record[field[0]])}]
    return messages


def _query_chat(rng, lang, pieces, pools) -> list[dict]:
    text = _RESULTS_TEXT[lang]
    search = random_name(rng, pieces)
    messages = [_tools_system(lang, [f"- {search}(query): {text['search']}"])]
    for _ in range(rng.randint(4, 6)):
        name, short = _item(_brand(rng, lang, pools), rng.choice(_ATTRIBUTES), rng.choice(_OBJECTS), lang)
        query = short if rng.random() < 0.7 else name
        field = rng.choice(_FIELDS)
        messages += [
            {"role": "user", "content": rng.choice(text["ask"]).format(q=query, f=field[0 if lang == "en" else 1])},
            _call(search, {"query": query}),
            {"role": "tool", "name": search,
             "content": json.dumps({"query": query, "total": rng.randint(0, 30)}, ensure_ascii=False)}]
    return messages


def _call(name: str, arguments: dict, reasoning: str | None = None) -> dict:
    """An assistant turn that calls `name` with `arguments` (after `reasoning` when given)."""
    call = {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}]}
    if reasoning is not None:
        call["reasoning_content"] = reasoning
    return call


def check_kinds(field: str, kinds: Sequence[str]) -> None:
    """Refuses anything but a non-empty tuple or list of names from `KINDS`.

    Raises:
      ValueError: naming `field`, the value, what was expected and the unknown kinds.
    """
    bad = [k for k in kinds if k not in KINDS] if isinstance(kinds, (tuple, list)) else None
    if bad is None or bad or not kinds:
        raise ValueError(f"{field} = {kinds!r}: expected a non-empty tuple or list of {KINDS}"
                         + (f" (unknown: {bad})" if bad else ""))


_MAKERS = {"lookup": _lookup_chat, "record": _record_chat, "copy": _copy_chat, "select": _select_chat,
           "call": _call_chat, "label": _label_chat, "tools": _tools_chat, "results": _results_chat,
           "query": _query_chat, "arguments": _arguments_chat}
_WITH_TOOLS = ("tools", "arguments")  # makers that return (messages, tools); the others return messages
# An "arguments" call turn carries this key, True: its answer is its argument's key, not the value (`turn_answer`).
# The chat template reads only the fields it knows, so the key never reaches the rendered text.
KEY_ANSWER = "reading_answer_is_key"
_WITH_SYMBOLS = ("copy", "results", "query")  # makers that also take the vocabulary's symbols (`token_symbols`)
_CJK = re.compile(r"[\u4e00-\u9fff]+")
_LATIN = re.compile(r"[A-Za-z]{2,}")


def token_symbols(tokenizer) -> tuple[str, ...]:
    """The tokens of a tokenizer's vocabulary that can stand alone as a name, decoded, in id order: runs of CJK
    characters and ASCII words of 2+ letters (a leading space dropped); no special token, no partial UTF-8.

    Why: a from-scratch base only trains the embeddings of the tokens its corpus contains, and the tiny BPE,
    trained on the world's texts too, merges whole product names into single tokens that no pretraining chat
    holds (their copy stays at 0, as the reading probe's names made of unseen pieces do). Exercises that copy
    these symbols train every embedding, as a real base's pretraining has; they carry no fact of the world.
    """
    special = set(tokenizer.all_special_ids)
    out = []
    for i in range(len(tokenizer)):
        if i in special:
            continue
        text = tokenizer.decode([i])
        word = text.removeprefix(" ")
        if _CJK.fullmatch(word) or _LATIN.fullmatch(word):
            out.append(word)
    return tuple(dict.fromkeys(out))


@dataclasses.dataclass(frozen=True)
class _SymbolPools:
    """The tokenizer's symbols (`token_symbols`) by the language whose exercises use them: `zh` CJK runs, `en`
    ASCII words. `zh_chars`: every CJK symbol is one character (a character-level vocabulary)."""

    zh: tuple[str, ...]
    en: tuple[str, ...]
    zh_chars: bool

    @classmethod
    def of(cls, symbols: Sequence[str]) -> _SymbolPools:
        zh = tuple(x for x in symbols if _CJK.fullmatch(x))
        en = tuple(x for x in symbols if _LATIN.fullmatch(x))
        return cls(zh, en, zh_chars=bool(zh) and all(len(x) == 1 for x in zh))

    def __getitem__(self, lang: str) -> tuple[str, ...]:
        return self.zh if lang == "zh" else self.en


def reading_chats(n: int, seed: int, *, zh_share: float = 0.5, kinds: Sequence[str] = KINDS,
                  symbols: Sequence[str] = ()) -> list[tuple[list[dict], list[dict]]]:
    """`n` reading-exercise chats (module docstring), deterministic per seed, kinds drawn uniformly.

    Args:
      n: number of chats (>= 0). seed: sampling seed. zh_share: share written in Chinese, in [0, 1].
      kinds: a non-empty subset of `KINDS`.
      symbols: names from the tokenizer's vocabulary (`token_symbols`; CJK runs and ASCII words). When given,
        every "results" and "query" brand is one of them (of the chat's language) and about half of the "copy" strings'
        parts are 1-3 of them; () keeps the built-in pools.
    Returns:
      [(messages, tools)]: OpenAI-format messages (tool calls as `tool_calls`, results as "tool" messages) and
      OpenAI tool dicts (the "tools" and "arguments" kinds; [] for the others, whose tools are listed in the
      system message), as `hat_jax.data.corpus.render_chat(messages, tools)` renders them.
    Raises:
      ValueError: negative n, zh_share outside [0, 1], unknown or no kinds, or "results" among the kinds with
        exactly one symbol of a language.
    """
    if n < 0:
        raise ValueError(f"reading_chats: n must be >= 0, got {n}")
    if not 0.0 <= zh_share <= 1.0:
        raise ValueError(f"reading_chats: zh_share must be in [0, 1], got {zh_share}")
    check_kinds("reading_chats: kinds", kinds)
    pieces, pools = name_pieces(), _SymbolPools.of(symbols)
    if "results" in kinds and (few := {lang: list(pools[lang]) for lang in ("zh", "en") if len(pools[lang]) == 1}):
        raise ValueError(f"reading_chats: symbols = {tuple(symbols)!r}: a \"results\" search lists items of "
                         f"another brand, so each language needs 0 or at least 2 symbols; {few} has one")
    rng = random.Random(f"reading-{seed}")
    out = []
    for _ in range(n):
        lang = "zh" if rng.random() < zh_share else "en"
        kind = rng.choice(list(kinds))
        made = _MAKERS[kind](rng, lang, pieces, *((pools,) if kind in _WITH_SYMBOLS else ()))
        out.append(made if kind in _WITH_TOOLS else (made, []))
    return out


ASSISTANT_OPEN, TURN_END = "<|im_start|>assistant\n", "<|im_end|>"


def _assistant_turns(text: str) -> Iterator[tuple[int, int]]:
    """(start, end) characters of each assistant turn's body in a rendered chat: from after
    `<|im_start|>assistant\n` to its `<|im_end|>` (exclusive; the text's end when the turn is cut)."""
    at = 0
    while (start := text.find(ASSISTANT_OPEN, at)) >= 0:
        start += len(ASSISTANT_OPEN)
        end = text.find(TURN_END, start)
        at = end = len(text) if end < 0 else end
        yield start, end


def answer_mask(text: str, offsets: Sequence[tuple[int, int]]) -> np.ndarray:
    """int32 [T]: 1 on the tokens of the assistant turns of a rendered chat (from after `<|im_start|>assistant\n`
    through its `<|im_end|>`), 0 elsewhere; `offsets` are the tokens' (start, end) characters in `text`."""
    starts = np.asarray([s for s, _ in offsets], np.int64)
    mask = np.zeros(len(offsets), np.int32)
    for s, e in _assistant_turns(text):
        mask[(starts >= s) & (starts < e + len(TURN_END))] = 1
    return mask


ANSWER_ORDERS: tuple[str, ...] = ("desc_first", "name_first")


def answer_order(messages: Sequence[dict], tools: Sequence[dict], answer: str) -> str | None:
    """Where a listed name stands beside the description its request matches, in what the chat shows:

    - "desc_first": the system message lists it as `- description: name` or `- description -> name` (the match
      comes first: copying what follows it finds the name, as in the reading gauge's default order and the
      compact harness's skill list);
    - "name_first": the name comes first (`name - description`, `<tool name="name">description</tool>`, or only the
      chat template's tool block), the order of a harness's tool block and of the production skill list;
    - None: `answer` is not a listed name (a looked-up value, a copied string, a reply).

    Args:
        messages, tools: one chat of `reading_chats`. answer: one of its answers (`exercise_answer_spans`).
    """
    system = messages[0]["content"] if messages and messages[0]["role"] == "system" else ""
    lines = system.splitlines()
    if any(line.endswith((f": {answer}", f" -> {answer}")) for line in lines):
        return "desc_first"
    listed = any(line.startswith(f"{answer} - ") or f'<tool name="{answer}">' in line for line in lines)
    if listed or any(t["function"]["name"] == answer for t in tools):
        return "name_first"
    return None


def turn_answer(message: dict) -> str:
    """The answer of one assistant turn of `reading_chats`: an "arguments" call's argument key (`KEY_ANSWER`),
    else the value of its call's single argument (the query or id that a "results" call copies), else the called
    tool's name, else the turn's content."""
    calls = message.get("tool_calls")
    if not calls:
        return message["content"]
    arguments = calls[0]["function"]["arguments"]
    if message.get(KEY_ANSWER):
        return next(iter(arguments))
    return str(next(iter(arguments.values()))) if len(arguments) == 1 else calls[0]["function"]["name"]


ANSWER_ROLES: tuple[str, ...] = ("name", "query", "id", "key", "reply")


def answer_role(message: dict) -> str:
    """What one assistant turn's answer (`turn_answer`) copies: "name" (a called tool's name), "query" (a search
    query, copied from the request), "id" (another call argument: a "results" chat's id, copied from a result
    list), "key" (an argument's key, copied from the tool's schema) or "reply" (the turn's content: a value, a
    listed name or a copied string)."""
    calls = message.get("tool_calls")
    if not calls:
        return "reply"
    if message.get(KEY_ANSWER):
        return "key"
    arguments = calls[0]["function"]["arguments"]
    if len(arguments) != 1:
        return "name"
    return "query" if "query" in arguments else "id"


def exercise_answer_spans(text: str, messages: Sequence[dict]) -> list[tuple[int, int]]:
    """[(start, end)] character spans of each assistant turn's answer (`turn_answer`) in the rendered chat `text`,
    in the order of the assistant turns: the first occurrence inside the turn after its reasoning.

    Raises:
        ValueError: an answer not found in its rendered turn (a template that drops it or a cut turn).
    """
    turns = [m for m in messages if m["role"] == "assistant"]
    spans = []
    for message, (start, end) in zip(turns, _assistant_turns(text)):
        answer = turn_answer(message)
        think_end = text.find("</think>", start, end)
        # a key is found as the template writes it (`<parameter=KEY>`), not inside the tool's name
        marker = "<parameter=" if message.get(KEY_ANSWER) else ""
        found = text.find(marker + answer, think_end + 1 if think_end >= 0 else start, end)
        found = found + len(marker) if found >= 0 else found
        if found < 0:
            raise ValueError(f"reading exercise answer {answer!r} not rendered in its turn {text[start:end]!r}")
        spans.append((found, found + len(answer)))
    if len(spans) < len(turns):
        raise ValueError(f"reading exercise: {len(turns)} assistant turns, {len(spans)} rendered")
    return spans
