"""The reading exercises (`hat_jax.data.reading`): every answer is a span of the context before it, the request
of a select/call turn points to exactly the entry whose name is answered, names come in every style, and the
corpus mixes them in at `reading_share` without changing the other chats."""

import json
import random
import re

import pytest

from hat_jax.data.corpus import pretraining_chats, render_chat
import numpy as np

from hat_jax.data.reading import (KINDS, NAME_STYLES, TASKS, answer_mask, answer_order, exercise_answer_spans,
                               name_pieces, random_name, reading_chats, turn_answer)


def answers(messages):
    """[(index, answer)]: each assistant turn's answer (its call's single argument value, else the called tool's
    name, else its content)."""
    return [(i, turn_answer(m)) for i, m in enumerate(messages) if m["role"] == "assistant"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_answer_is_written_before_it(kind):
    for messages, tools in reading_chats(40, 3, kinds=[kind]):
        found = answers(messages)
        assert len(found) >= 2, messages  # several reading decisions per chat
        assert bool(tools) == (kind == "tools")
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


def test_a_results_chat_searches_the_request_fetches_the_match_and_copies_its_field():
    """Each round: the search's query is the request's short name verbatim, the fetched id is that of the listed
    item whose name has the query's brand and object, the reply is the asked field's value in the fetched record;
    the match is listed first in about 3 of 4 searches, and ids share their letter within a chat."""
    first = rounds = 0
    for messages, tools in reading_chats(40, 13, kinds=["results"]):
        (search, query_key), (fetch, id_key) = re.findall(r"^- (\S+)\((\S+)\): ", messages[0]["content"], re.M)
        assert query_key == "query" and not tools
        letters = set()
        for i, m in enumerate(messages):
            if m["role"] != "user" or m["content"].startswith("<"):
                continue
            query = messages[i + 1]["tool_calls"][0]["function"]["arguments"]["query"]
            assert messages[i + 1]["tool_calls"][0]["function"]["name"] == search and query in m["content"]
            found = json.loads(messages[i + 2]["content"])
            call = messages[i + 3]["tool_calls"][0]["function"]
            assert call["name"] == fetch and list(call["arguments"]) == [id_key]
            cuts = [query.index(" ")] if " " in query else range(1, len(query))  # brand | object
            matches = [x[id_key] for x in found["items"] if len(x["name"]) > len(query) and any(
                x["name"].startswith(query[:k]) and x["name"].endswith(query[k:]) for k in cuts)]
            assert matches == [call["arguments"][id_key]], (query, found)
            assert re.fullmatch(r"[A-Z]\d{4}", matches[0])
            letters |= {x[id_key][0] for x in found["items"]}
            record = json.loads(messages[i + 4]["content"])
            assert record[id_key] == matches[0] and found["total"] >= len(found["items"]) >= 3
            assert messages[i + 5]["content"] in {json.dumps(v) for k, v in record.items() if k not in (id_key, "name")}
            first += found["items"][0][id_key] == matches[0]
            rounds += 1
        assert len(letters) == 1
    assert 0.7 < first / rounds < 0.9, (first, rounds)


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
                if kind in ("lookup", "record", "copy", "results") or (kind != "select" and not messages[i].get("tool_calls")):
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
