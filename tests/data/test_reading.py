"""The reading exercises (`hat_jax.data.reading`): every answer is a span of the context before it, the request
of a select/call turn points to exactly the entry whose name is answered, names come in every style, and the
corpus mixes them in at `reading_share` without changing the other chats."""

import collections
import json
import random
import re

import pytest

from hat_jax.data.corpus import pretraining_chats, render_chat
import numpy as np

from hat_jax.data import reading
from hat_jax.data.reading import (KINDS, NAME_STYLES, TASKS, answer_mask, answer_order, exercise_answer_spans,
                               answer_role, name_pieces, random_name, reading_chats,
                               token_symbols, turn_answer)


def answers(messages):
    """[(index, answer)]: each assistant turn's answer (its call's single argument value, else the called tool's
    name, else its content)."""
    return [(i, turn_answer(m)) for i, m in enumerate(messages) if m["role"] == "assistant"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_answer_is_written_before_it(kind):
    for messages, tools in reading_chats(40, 3, kinds=[kind]):
        found = answers(messages)
        assert len(found) >= 2, messages  # several reading decisions per chat
        assert bool(tools) == (kind in ("tools", "arguments"))
        for i, answer in found:
            before = "\n".join([json.dumps(tools)] + [str(m.get("content", "")) for m in messages[:i]])
            assert answer and answer in before, (answer, before)


@pytest.mark.parametrize("kind", ["select", "call"])
def test_a_request_points_to_the_entry_it_answers(kind):
    """The entry listed under the answered name has the requested task's description (or the task of its gist)."""
    by_text = {t[k][lang].rstrip(".。"): t["desc"][lang] for t in TASKS for k in ("desc", "gist") for lang in ("en", "zh")}
    for messages, _ in reading_chats(40, 5, kinds=[kind]):
        listing = messages[0]["content"]
        for i, name in answers(messages):
            if messages[i].get("tool_calls") is None and kind == "call":
                continue  # the reply that copies the tool result
            request = messages[i - 1]["content"]
            desc = next(by_text[text] for text in sorted(by_text, key=len, reverse=True) if text in request)
            line = next(line for line in listing.splitlines() if re.search(rf'(^|[ "=]){re.escape(name)}($|[ "<])', line))
            assert desc in line, (request, name, listing)


def test_a_tools_chat_is_a_harness_surface_and_its_reasoning_names_the_matched_description():
    """The called tool's definition (the template's tool dicts) carries the requested task's description, which
    the call's reasoning quotes; when the system message lists the tools, it lists the same ones in order."""
    by_text = {t[k][lang].rstrip(".。"): t for t in TASKS for k in ("desc", "gist") for lang in ("en", "zh")}
    listed = 0
    for messages, tools in reading_chats(40, 11, kinds=["tools"]):
        desc_of = {t["function"]["name"]: t["function"]["description"] for t in tools}
        system = messages[0]["content"]
        if len(system.splitlines()) > 1:
            listed += 1
            assert [n for n in desc_of if n in system] == list(desc_of)
            assert all(d in system for d in desc_of.values())
        for i, name in answers(messages):
            if messages[i].get("tool_calls") is None:
                continue  # the reply that copies the tool result
            request = messages[i - 1]["content"]
            task = next(by_text[text] for text in sorted(by_text, key=len, reverse=True) if text in request)
            assert desc_of[name] in (task["desc"]["en"], task["desc"]["zh"])
            assert desc_of[name] in messages[i]["reasoning_content"]
            assert render_chat(messages, tools).count(f"<function={name}>") >= 1
    assert 5 < listed < 35  # about half list them again


def test_an_arguments_call_writes_its_value_under_the_key_its_tool_declares():
    """The scored answer of each call is its argument's key: the one the called tool's schema declares (required),
    distinct from the chat's other tools' keys, in every argument style (PascalCase, held out of HSA training,
    too); the request carries the value; the span is the key inside `<parameter=...>`, never the marker field."""
    from hat_jax.harness.hsa_vocab import name_style

    styles, calls = collections.Counter(), 0
    for messages, tools in reading_chats(40, 13, kinds=["arguments"]):
        schema = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
        keys = [next(iter(p["properties"])) for p in schema.values()]
        assert len(set(keys)) == len(keys) and all(p["required"] == list(p["properties"]) for p in schema.values())
        assert not set(keys) & set(schema)  # no key is also a tool's name
        styles.update(name_style(k) for k in keys)
        text = render_chat(messages, tools)
        assert reading.KEY_ANSWER not in text
        turns = [m for m in messages if m["role"] == "assistant"]
        for message, (a, b) in zip(turns, exercise_answer_spans(text, messages), strict=True):
            if not message.get("tool_calls"):
                assert answer_role(message) == "reply"
                continue
            calls += 1
            call = message["tool_calls"][0]["function"]
            (key, value), = call["arguments"].items()
            assert key == next(iter(schema[call["name"]]["properties"])) and turn_answer(message) == key
            assert answer_role(message) == "key" and text[a:b] == key and text[a - len("<parameter="):a] == "<parameter="
            request = messages[messages.index(message) - 1]["content"]
            assert value in request
    assert calls >= 80 and {"snake", "camel", "pascal"} <= set(styles), styles


def test_a_label_request_is_its_listed_label_verbatim():
    gists = {t["gist"][lang] for t in TASKS for lang in ("en", "zh")}
    for messages, _ in reading_chats(40, 9, kinds=["label"]):
        listing = messages[0]["content"]
        for i, name in answers(messages):
            if messages[i].get("tool_calls"):
                label = messages[i - 1]["content"]
                assert label in gists
                line = next(line for line in listing.splitlines() if label in line)
                assert re.search(rf'(^|[ "=]){re.escape(name)}($|[ "<])', line), (label, name, listing)


@pytest.mark.parametrize("kind", ["call", "label", "tools"])
def test_call_replies_copy_the_tool_result(kind):
    for messages, _ in reading_chats(20, 7, kinds=[kind]):
        for i, m in enumerate(messages):
            if m["role"] == "tool":
                assert messages[i + 1]["content"] in json.loads(m["content"]).values()


def _default_brand(query: str) -> str:
    """The brand a built-in results query starts with: its first word and the space, or two characters."""
    return query.split(" ", 1)[0] + " " if " " in query else query[:2]


@pytest.mark.parametrize("symbols", [(), ("甲乙丙", "丁戊", "庚", "alpha", "beta", "a", "x y", "<b>")])
def test_a_results_chat_searches_the_request_fetches_the_match_and_copies_its_field(symbols):
    """Each round: the search's query is the request's item name verbatim (the short or the full name, wrapped in
    the request), after a guide call whose result names both tools in the chats that list a guide; the fetched id
    is that of the only listed item with the query's brand and object (the others share one of the two); the
    reply is the asked field's value in the fetched record; the match is listed first in about 3 of 4 searches,
    and ids share their letter within a chat. With vocabulary symbols, every brand is one of them (a CJK run in
    a Chinese chat, a word of 2+ letters in an English one; "a", "x y" and "<b>" are never names) and every
    symbol is used."""
    first = rounds = wrapped = full = guided = 0
    chats = reading_chats(60, 13, kinds=["results"], symbols=symbols)
    names = {"甲乙丙", "丁戊", "庚", "alpha ", "beta "}
    brands = set()

    def brand_of(query: str) -> str:
        if not symbols:
            return _default_brand(query)
        brand, = [b for b in names if query.startswith(b)]
        brands.add(brand)
        return brand

    for messages, tools in chats:
        listed = dict(re.findall(r"^- (\S+)\((\S*)\): ", messages[0]["content"], re.M))
        (search, query_key), (fetch, id_key) = [(n, a) for n, a in listed.items() if a]
        assert query_key == "query" and not tools and len(listed) in (2, 3)
        guide = next((n for n, a in listed.items() if not a), None)
        guided += guide is not None
        letters = set()
        for i, m in enumerate(messages):
            if m["role"] != "user":
                continue
            j = i + 1
            if guide is not None:
                assert messages[j]["tool_calls"][0]["function"] == {"name": guide, "arguments": {}}
                assert answer_role(messages[j]) == "name" and turn_answer(messages[j]) == guide
                assert search in messages[j + 1]["content"] and fetch in messages[j + 1]["content"]
                j += 2
            query = messages[j]["tool_calls"][0]["function"]["arguments"]["query"]
            assert messages[j]["tool_calls"][0]["function"]["name"] == search and query in m["content"]
            wrapped += not m["content"].startswith(query)
            found = json.loads(messages[j + 1]["content"])
            call = messages[j + 2]["tool_calls"][0]["function"]
            assert call["name"] == fetch and list(call["arguments"]) == [id_key]
            brand = brand_of(query)
            rest = query.rsplit(" ", 1)[1] if " " in query else query[len(brand):]
            full += any(x["name"] == query for x in found["items"])
            matches = [x[id_key] for x in found["items"] if x["name"].startswith(brand) and x["name"].endswith(rest)]
            assert matches == [call["arguments"][id_key]], (query, found)
            name = next(x["name"] for x in found["items"] if x[id_key] == matches[0])
            obj = max((o for pair in reading._OBJECTS for o in pair if name.endswith(o)), key=len)
            assert all(x["name"].startswith(brand) != x["name"].endswith(obj) for x in found["items"]
                       if x[id_key] != matches[0]), found  # each other item shares the brand or the object
            assert re.fullmatch(r"[A-Z]\d{4}", matches[0])
            letters |= {x[id_key][0] for x in found["items"]}
            record = json.loads(messages[j + 3]["content"])
            assert record[id_key] == matches[0] and found["total"] >= len(found["items"]) >= 3
            assert messages[j + 4]["content"] in {json.dumps(v) for k, v in record.items() if k not in (id_key, "name")}
            first += found["items"][0][id_key] == matches[0]
            rounds += 1
        assert len(letters) == 1
    assert rounds == 2 * len(chats) and 0.7 < first / rounds < 0.9, (first, rounds)
    assert 0.5 < wrapped / rounds < 0.9 and 0.15 < full / rounds < 0.45 and 0.3 < guided / len(chats) < 0.7
    assert brands == (names if symbols else set())


def test_a_character_level_vocabulary_gives_two_character_brands():
    """When every CJK symbol is one character (the "chars" tokenizer split), a Chinese brand is two of them, drawn
    independently; English brands stay one word."""
    symbols = ("甲", "乙", "丙", "丁", "alpha", "beta")
    brands = collections.Counter()
    for messages, _ in reading_chats(40, 5, kinds=["results", "query"], symbols=symbols):
        for m in messages:
            for call in m.get("tool_calls") or ():
                query = call["function"]["arguments"].get("query")
                if query is None:
                    continue
                if " " in query:
                    assert query.split(" ", 1)[0] in ("alpha", "beta")
                else:
                    assert query[0] in "甲乙丙丁" and query[1] in "甲乙丙丁" and query[2] not in "甲乙丙丁"
                    brands[query[:2]] += 1
    assert len(brands) >= 12 and any(b[0] == b[1] for b in brands)  # of the 16 pairs; a repeat is allowed


@pytest.mark.parametrize("symbols", [(), ("甲乙丙", "丁戊", "alpha")])
def test_a_query_chat_searches_each_wrapped_request_by_its_name(symbols):
    """4-6 requests per chat, each answered by a call of the one listed search tool whose query is the request's
    item name (a symbol's when given); the tool answers with the query and a count; most names are wrapped."""
    rounds = wrapped = 0
    for messages, tools in reading_chats(30, 4, kinds=["query"], symbols=symbols):
        (search, key), = re.findall(r"^- (\S+)\((\S+)\): ", messages[0]["content"], re.M)
        users = [i for i, m in enumerate(messages) if m["role"] == "user"]
        assert key == "query" and not tools and 4 <= len(users) <= 6 and len(messages) == 1 + 3 * len(users)
        for i in users:
            call, = messages[i + 1]["tool_calls"]
            query = call["function"]["arguments"]["query"]
            assert call["function"]["name"] == search and query in messages[i]["content"]
            assert turn_answer(messages[i + 1]) == query and answer_role(messages[i + 1]) == "query"
            assert json.loads(messages[i + 2]["content"])["query"] == query and query in messages[i + 2]["content"]
            assert not symbols or query.startswith(tuple(symbols))
            wrapped += not messages[i]["content"].startswith(query)
            rounds += 1
    assert 0.5 < wrapped / rounds < 0.9


def test_copy_strings_draw_on_the_symbols_and_pretraining_passes_them_on():
    symbols = ("甲乙丙", "丁戊", "alpha")
    strings = [m["content"] for messages, _ in reading_chats(40, 2, kinds=["copy"], symbols=symbols)
               for m in messages if m["role"] == "assistant"]
    with_symbol = [x for x in strings if any(s in x for s in symbols)]
    assert 0.3 < len(with_symbol) / len(strings) < 0.9
    assert not any(s in x for x in (m["content"] for messages, _ in reading_chats(40, 2, kinds=["copy"])
                                     for m in messages) for s in symbols)
    chats = pretraining_chats(20, 3, reading_share=0.5, reading_kinds=("copy",), reading_symbols=symbols)
    assert chats[10:] == reading_chats(10, 3, kinds=("copy",), symbols=symbols)


class _Vocab:
    """A tokenizer's vocabulary as `token_symbols` reads it."""

    pieces = ("<|im_end|>", " price", "商品", "\n", "\ufffd", "a", "get_", "P0", "小满雪纺衬衫", " Shop", "商品", "x y")
    all_special_ids = (0,)

    def __len__(self):
        return len(self.pieces)

    def decode(self, ids):
        return "".join(self.pieces[i] for i in ids)


def test_token_symbols_keeps_the_tokens_that_stand_alone_as_names():
    assert token_symbols(_Vocab()) == ("price", "商品", "小满雪纺衬衫", "Shop")


def test_deterministic_every_style_and_renderable():
    a, b = reading_chats(30, 1), reading_chats(30, 1)
    assert a == b and a != reading_chats(30, 2)
    rng, pieces = random.Random(0), name_pieces()
    names = [random_name(rng, pieces) for _ in range(400)]
    assert any("." in n for n in names) and any(n[:1].isupper() for n in names) and any("-" in n for n in names)
    assert set(NAME_STYLES) == {"snake", "camel", "kebab", "dotted", "pascal"}
    assert "price" in pieces and "get" in pieces and len(set(pieces)) == len(pieces)
    for messages, tools in a:
        text = render_chat(messages, tools)
        assert text.startswith("<|im_start|>") and text.count("<|im_start|>assistant") == len(answers(messages))


def test_reading_share_adds_exercises_after_the_same_other_chats():
    mixed = pretraining_chats(40, 0, reading_share=0.25)
    assert len(mixed) == 40 and mixed[:30] == pretraining_chats(30, 0)
    assert reading_chats(10, 0) == mixed[30:]
    assert pretraining_chats(40, 0, reading_share=0.0) == pretraining_chats(40, 0)
    only = pretraining_chats(40, 0, reading_share=0.25, reading_kinds=("label",))
    assert only[:30] == mixed[:30] and reading_chats(10, 0, kinds=("label",)) == only[30:]


@pytest.mark.parametrize("kwargs, message", [
    ({"n": -1}, "n must be >= 0, got -1"),
    ({"zh_share": 2.0}, r"zh_share must be in \[0, 1\], got 2.0"),
    ({"kinds": ["lookup", "quiz"]}, r"kinds = .*\(unknown: \['quiz'\]\)"),
    ({"kinds": []}, r"kinds = \[\]: expected a non-empty tuple"),
    ({"kinds": ["results"], "symbols": ("甲乙", "丙丁", "alpha")},
     r"symbols = .*each language needs 0 or at least 2 symbols; \{'en': \['alpha'\]\} has one"),
])
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        reading_chats(**{"n": 2, "seed": 0, **kwargs})
    with pytest.raises(ValueError, match=r"reading_share must be in \[0, 1\], got -0.5"):
        pretraining_chats(4, 0, reading_share=-0.5)


def test_answer_mask_covers_the_assistant_turns_through_their_end_marker():
    text = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nok<|im_end|>\n<|im_start|>assistant\nab"
    mask = answer_mask(text, [(i, i + 1) for i in range(len(text))])  # one token per character
    covered = "".join(c for c, m in zip(text, mask) if m)
    assert covered == "ok<|im_end|>" + "ab"  # an unterminated last turn runs to the end
    assert mask.dtype == np.int32 and len(mask) == len(text)


@pytest.mark.parametrize("kind", KINDS)
def test_exercise_answer_spans_are_the_answers_in_their_turns(kind):
    for messages, tools in reading_chats(10, 4, kinds=[kind]):
        text = render_chat(messages, tools)
        spans = exercise_answer_spans(text, messages)
        assert [text[a:b] for a, b in spans] == [answer for _, answer in answers(messages)]
        turns = [i for i in range(len(text)) if text.startswith("<|im_start|>assistant", i)]
        assert all(t < a for t, (a, _) in zip(turns, spans))  # each inside its own turn, in order
        assert all(a >= turns[k] and (k + 1 == len(turns) or b <= turns[k + 1]) for k, (a, b) in enumerate(spans))


def test_answer_order_says_whether_the_listed_name_comes_before_its_description():
    """Checked against where the name stands on its listing line (found as a whole word, as above): at the line's
    end after a description -> desc_first, at its start -> name_first; names only in the tools block are
    name_first; answers that are not listed names are None."""
    seen = set()
    for kind in KINDS:
        for messages, tools in reading_chats(30, 8, kinds=[kind]):
            system = messages[0]["content"] if messages[0]["role"] == "system" else ""
            for i, answer in answers(messages):
                order = answer_order(messages, tools, answer)
                seen.add((kind, order))
                not_listed = kind in ("lookup", "record", "copy", "results", "query", "arguments")
                if not_listed or (kind != "select" and not messages[i].get("tool_calls")):
                    assert order is None, (kind, answer)
                    continue
                found = [(m, line) for line in system.splitlines()[1:]
                         if (m := re.search(rf'(^|[ "=]){re.escape(answer)}($|[ "<])', line))]
                if not found:
                    assert kind == "tools" and order == "name_first", (answer, system)
                    continue
                (m, line), = found
                at_end, at_start = m.end() == len(line), m.start() == 0 or line.startswith(f'<tool name="{answer}"')
                assert at_end != at_start, line
                assert order == ("desc_first" if at_end else "name_first"), (line, answer, order)
    for kind in ("select", "call", "label", "tools"):
        assert {(kind, "desc_first"), (kind, "name_first")} <= seen, kind
