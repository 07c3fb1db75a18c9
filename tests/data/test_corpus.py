"""Pretraining corpus: mixed general and random-harness tool chats, rendering, tokenizer texts, recall probe."""

import json
import random
import re

import pytest

from hat_jax.data import corpus
from hat_jax.data.corpus import (
    TRAIN_NAMING_STYLES,
    pretraining_chats,
    recall_probe,
    render_chat,
    style_name,
    tokenizer_training_texts,
)
from hat_jax.tokenizer import parse_tool_calls, split_reasoning, train_bpe_tokenizer

STYLE_PATTERNS = {
    "snake": r"[a-z]+(_[a-z]+)+",
    "camel": r"[a-z]+([A-Z][a-z]+)+",
    "kebab": r"[a-z]+(-[a-z]+)+",
    "dotted": r"[a-z]+(\.[a-z]+)+",
}
LIVE_STREAM_WORDS = ("直播", "主播", "商品", "优惠券", "尺码", "live stream", "livestream", "coupon", "SKU")


@pytest.fixture(scope="module")
def chats():
    return pretraining_chats(400, seed=0)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    texts = tokenizer_training_texts(60, seed=5, extra_texts=["直播间的商品价格"])
    return train_bpe_tokenizer(texts, vocab_size=600, out_dir=tmp_path_factory.mktemp("tok"))


def _tool_chats(chats):
    return [(m, t) for m, t in chats if t]


def test_style_name_hand_cases():
    assert style_name(["get", "box", "info"], "snake") == "get_box_info"
    assert style_name(["get", "box", "info"], "camel") == "getBoxInfo"
    assert style_name(["get", "box"], "kebab") == "get-box"
    assert style_name(["get", "box"], "dotted") == "get.box"
    with pytest.raises(ValueError, match="naming style"):
        style_name(["a", "b"], "Pascal")


def test_mix_languages_and_determinism(chats):
    general_count = sum(1 for _, tools in chats if not tools)
    assert 0.25 < general_count / len(chats) < 0.45  # general_share=0.35
    zh = [m for m, t in _tool_chats(chats) if re.search(r"[\u4e00-\u9fff]", m[1]["content"])]
    assert 0.15 < len(zh) / len(_tool_chats(chats)) < 0.45  # zh_share=0.3
    assert pretraining_chats(30, seed=0) == pretraining_chats(30, seed=0)
    assert pretraining_chats(30, seed=1) != pretraining_chats(30, seed=0)
    only_tools = pretraining_chats(20, seed=0, general_share=0.0)
    assert all(tools for _, tools in only_tools)


def test_no_live_stream_data(chats):
    for messages, tools in chats:
        text = render_chat(messages, tools)
        assert not any(word.lower() in text.lower() for word in LIVE_STREAM_WORDS), text[-300:]


def test_tool_chat_calls_the_listed_tool_and_answer_copies_the_result(chats):
    styles_seen = set()
    for messages, tools in _tool_chats(chats):
        assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
        names = [t["function"]["name"] for t in tools]
        assert len(set(names)) == len(names) >= 4
        style = next(s for s, pat in STYLE_PATTERNS.items() if all(re.fullmatch(pat, n) for n in names))
        styles_seen.add(style)
        assert all(n in messages[0]["content"] for n in names)  # the system prompt lists every tool
        call = messages[2]["tool_calls"][0]["function"]
        tool = tools[names.index(call["name"])]["function"]
        assert set(call["arguments"]) == set(tool["parameters"]["properties"]) == set(tool["parameters"]["required"])
        assert tool["description"] in messages[2]["reasoning_content"]  # reasoning names it by description
        assert call["name"] not in messages[2]["reasoning_content"]
        assert messages[3]["name"] == call["name"]
        for value in json.loads(messages[3]["content"]).values():
            assert str(value) in messages[4]["content"]
    assert styles_seen == set(TRAIN_NAMING_STYLES)


def test_general_chats_carry_reasoning_and_a_checked_response(chats):
    from hat_jax.data.general import INSTRUCTION_IDS, check_instruction

    general_chats = [m for m, t in chats if not t]
    assert general_chats
    for messages in general_chats:
        assert messages[-1]["role"] == "assistant" and messages[-1]["reasoning_content"].startswith("A short answer")
    # the responses are those of general.py, checked there; spot-check one instruction here
    assert "punctuation:no_comma" in INSTRUCTION_IDS and check_instruction("punctuation:no_comma", {}, "a b")


def test_render_matches_the_tokenizer_and_tool_calls_parse_back(chats, tokenizer):
    for messages, tools in chats[:60]:
        text = render_chat(messages, tools)
        assert text == tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False)
        assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
        if tools:
            turn = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
            reasoning, _ = split_reasoning(turn)
            assert reasoning == messages[2]["reasoning_content"]
            parsed = parse_tool_calls(turn, tools)
            assert parsed == [messages[2]["tool_calls"][0]["function"]]


def test_tokenizer_texts_append_extra_texts():
    texts = tokenizer_training_texts(5, seed=2, extra_texts=("主播:这件毛衣", "catalog line"))
    assert len(texts) == 7 and texts[-2:] == ["主播:这件毛衣", "catalog line"]
    assert all(t.startswith("<|im_start|>") for t in texts[:5])


def test_recall_probe_prefix_is_the_training_format(tokenizer):
    probes = recall_probe(25, seed=0)
    assert recall_probe(25, seed=0) == probes
    rng = random.Random("recall-probe-0")  # recall_probe's stream: rebuild the full chats
    for probe in probes:
        messages, tools, _, name = corpus._tool_chat(
            rng, corpus.NAME_PIECES, TRAIN_NAMING_STYLES, corpus.SYSTEM_LAYOUTS, 0.3
        )
        assert name == probe.expected_name and messages[:2] == probe.messages
        assert probe.expected_name in [t["function"]["name"] for t in probe.tools]
        assert probe.expected_name in probe.messages[0]["content"]
        prompt = tokenizer.apply_chat_template(
            probe.messages, tools=probe.tools, add_generation_prompt=True, tokenize=False
        )
        assert prompt == render_chat(probe.messages, probe.tools, add_generation_prompt=True)
        assert render_chat(messages, tools).startswith(prompt + probe.assistant_prefix + probe.expected_name + ">\n")
    train_users = {m[1]["content"] + m[0]["content"] for m, t in pretraining_chats(200, seed=0) if t}
    assert sum(p.messages[1]["content"] + p.messages[0]["content"] in train_users for p in probes) <= 1


def test_defaults_avoid_the_hsa_held_out_families():
    hsa_vocab = pytest.importorskip("hat_jax.harness.hsa_vocab")
    assert set(TRAIN_NAMING_STYLES) <= set(hsa_vocab.TRAIN_TOOL_STYLES)
    assert not set(TRAIN_NAMING_STYLES) & set(hsa_vocab.HELDOUT_TOOL_STYLES)
    assert set(corpus.SYSTEM_LAYOUTS) <= set(hsa_vocab.TRAIN_HEADING_STYLES)


def test_custom_pools_and_bad_arguments():
    chats = pretraining_chats(
        40, seed=3, general_share=0.0, name_pieces=("aa", "bb", "cc", "dd", "ee", "ff"), styles=("kebab",)
    )
    for _, tools in chats:
        for t in tools:
            assert re.fullmatch(r"(aa|bb|cc|dd|ee|ff)(-(aa|bb|cc|dd|ee|ff)){1,2}", t["function"]["name"])
    dotted = pretraining_chats(5, seed=3, general_share=0.0, styles=("dotted",))
    assert all(re.fullmatch(STYLE_PATTERNS["dotted"], t["function"]["name"]) for _, ts in dotted for t in ts)
    with pytest.raises(ValueError, match="styles"):
        pretraining_chats(3, 0, styles=("Pascal",))
    with pytest.raises(ValueError, match="layouts"):
        pretraining_chats(3, 0, layouts=())
    with pytest.raises(ValueError, match="general_share"):
        pretraining_chats(3, 0, general_share=1.5)
    with pytest.raises(ValueError, match="name_pieces"):
        pretraining_chats(3, 0, name_pieces=("a", "b"))
