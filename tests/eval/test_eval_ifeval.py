"""IFEval: the strict/loose loop on hand-computed cases, the official file's checks and sources, real scores of
hand-written responses against the official prompts, and reproducibility."""

from __future__ import annotations

import json
import logging
import random
import shutil

import pytest
from eval_helpers import SHARED_IFEVAL

from hat_jax.eval import ifeval as ifeval_data
from hat_jax.eval.if_checker import (PUNKT_FILES, ensure_punkt_tab, loose_variants, response_text, score_responses,
                                     summarize)
from hat_jax.eval.ifeval import IFEVAL_ENV, IFEVAL_SHA256, load_ifeval, read_verified

needs_shared = pytest.mark.skipif(not SHARED_IFEVAL.is_file(),
                                  reason=f"the official IFEval file is not at {SHARED_IFEVAL} (a machine-local copy "
                                         f"outside the repo); set up ../shared/ifeval to run this test")


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HAT_JAX_CACHE", str(tmp_path_factory.getbasetemp() / "hat-cache"))
    monkeypatch.delenv(IFEVAL_ENV, raising=False)


REAL_HUB_UNREACHABLE = ifeval_data.hub_unreachable


@pytest.fixture(autouse=True)
def _hub_reachable(monkeypatch):
    """The tests that fake `_load_hub` need the connectivity check to pass (this machine has no network)."""
    monkeypatch.setattr(ifeval_data, "hub_unreachable", lambda: None)


def test_offline_mode_skips_the_hub_without_asking_it(monkeypatch, caplog):
    monkeypatch.setattr(ifeval_data, "hub_unreachable", REAL_HUB_UNREACHABLE)
    monkeypatch.delenv(IFEVAL_ENV, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(ifeval_data, "_load_hub", lambda: pytest.fail("the hub must not be asked offline"))
    assert REAL_HUB_UNREACHABLE() == "HF_HUB_OFFLINE is set"
    with caplog.at_level(logging.WARNING, logger="hat_jax.eval.ifeval"):
        assert load_ifeval(None) is None
    assert "HF_HUB_OFFLINE is set" in caplog.text and "--ifeval-data FILE" in caplog.text
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens there
    assert REAL_HUB_UNREACHABLE(timeout_s=1.0).startswith("no connection to 127.0.0.1:9")


def _rec(key, ids, kwargs, prompt="p"):
    return {"key": key, "prompt": prompt, "instruction_id_list": ids, "kwargs": kwargs}


def test_strict_and_loose_hand_computed():
    records = [
        _rec(1, ["punctuation:no_comma", "keywords:existence"], [{}, {"keywords": ["river"]}]),
        _rec(2, ["startend:end_checker", "punctuation:no_comma"], [{"end_phrase": "Any other questions?"}, {}]),
        _rec(3, ["startend:quotation"], [{}]),
        _rec(4, ["keywords:existence"], [{"keywords": ["river"]}]),
    ]
    responses = [
        "I saw a river today",                                   # both followed
        "Hi there.\nAny other questions?\nP.S. bye, friend",     # strict: last line breaks both; loose: drop it
        '*"hello"*',                                             # strict: not quoted; loose: '*' stripped
        "",                                                      # empty: never followed
    ]
    summary, verdicts = score_responses(records, responses)
    assert [(v.strict, v.loose) for v in verdicts] == [
        ((True, True), (True, True)), ((False, False), (True, True)), ((False,), (True,)), ((False,), (False,))]
    # prompt strict 1/4, instruction strict 2/6, prompt loose 3/4, instruction loose 5/6
    assert summary == pytest.approx({"prompt_strict": 25.0, "inst_strict": 100 * 2 / 6, "prompt_loose": 75.0,
                                     "inst_loose": 100 * 5 / 6})
    assert verdicts[1].to_json()["prompt_loose"] is True and verdicts[1].to_json()["prompt_strict"] is False


def test_loose_variants_in_the_official_order():
    assert loose_variants("*a*\nb\n*c*") == ["*a*\nb\n*c*", "a\nb\nc", "b\n*c*", "*a*\nb", "b", "b\nc", "a\nb", "b"]
    assert loose_variants("one") == ["one", "one", "", "", "", "", "", ""]


def test_response_text_cuts_the_reasoning():
    assert response_text("plan it\n</think>\n\nHello there.<|im_end|>") == "Hello there."
    assert response_text("<think>\nplan\n</think>\n\nHi") == "Hi"
    assert response_text("still thinking, cut by the token limit") == ""
    assert response_text("a</think>b</think>c") == "b</think>c"


def test_summarize_rejects_nothing():
    with pytest.raises(ValueError, match="nothing to score"):
        summarize([])
    with pytest.raises(ValueError, match="2 records but 1 responses"):
        score_responses([_rec(1, [], []), _rec(2, [], [])], ["x"])


def test_unknown_instruction_id_is_named():
    with pytest.raises(KeyError, match="'made:up'"):
        score_responses([_rec(1, ["made:up"], [{}])], ["x"])


def test_punkt_tab_written_offline(tmp_path):
    import nltk

    root = ensure_punkt_tab(tmp_path / "nltk")
    assert all((root / "tokenizers" / "punkt_tab" / "english" / f).is_file() for f in PUNKT_FILES)
    assert nltk.data.path[0] == str(root)
    ensure_punkt_tab(tmp_path / "nltk")  # idempotent
    from if_verifiable.ifeval.instructions_util import count_sentences

    assert count_sentences("Mr. Smith went to Washington. He slept there! Did he?") == 3


# ------------------------------------------------------------------------------------------ the official file
@needs_shared
def test_real_prompts_hand_written_responses():
    records = {r["key"]: r for r in read_verified(SHARED_IFEVAL)}
    repeat_1012 = records[1012]["kwargs"][0]["prompt_to_repeat"]
    repeat_1129 = records[1129]["kwargs"][1]["prompt_to_repeat"]
    cases = [  # (key, response, strict verdicts)
        (1001, "Day one we sail to Tokyo and rest. Day two we walk the old streets.", (True,)),
        (1001, "Day one, we sail to Tokyo.", (False,)),
        (1012, repeat_1012 + "\n<<Resignation>>\nDear boss: I quit.", (True, True)),
        (1012, "<<Resignation>>\nDear boss: I quit.", (False, True)),
        (1019, "what are the two young boys holding in their hands while they play outside with their toy guns "
               "and their horns?", (True,)),
        # 1122 and 1129 carry an unusable letter ('#', '!'): the checker draws one; with random.seed(0) it is 'y'
        (1122, "yesterday you and your young friends enjoyed a yummy party at the mansion. #fun #party #night "
               "#friends", (True, True)),
        (1122, "we had a great party at the mansion with all of our friends tonight. #fun", (True, False)),
        (1129, repeat_1129 + " yummy yummy yay yes!", (True, True)),
    ]
    picked = [records[k] for k, _, _ in cases]
    summary, verdicts = score_responses(picked, [r for _, r, _ in cases])
    assert [v.strict for v in verdicts] == [s for _, _, s in cases]
    n_inst = sum(len(s) for _, _, s in cases)
    assert summary["inst_strict"] == pytest.approx(100 * sum(sum(s) for _, _, s in cases) / n_inst)
    assert summary["prompt_strict"] == pytest.approx(100 * 5 / 8)
    assert all(all(v.loose) >= all(v.strict) for v in verdicts)


@needs_shared
def test_scores_are_reproducible_and_leave_random_alone():
    records = read_verified(SHARED_IFEVAL, limit=40)
    responses = [f"Response number {i}, written in English with a few words. **Bold** ends here." for i in range(40)]
    random.seed(123)
    expected_next = random.random()
    random.seed(123)
    first = score_responses(records, responses)
    assert random.random() == expected_next, "scoring must restore the caller's random state"
    second = score_responses(records, responses)
    assert first == second
    # a prompt's verdict does not depend on the prompts scored before it
    alone = score_responses(records[-5:], responses[-5:])[1]
    assert alone == first[1][-5:]


@needs_shared
def test_official_file_is_verified(tmp_path):
    assert len(read_verified(SHARED_IFEVAL)) == 541
    head = read_verified(SHARED_IFEVAL, limit=3)
    assert [r["key"] for r in head] == [1000, 1001, 1005] and head[0]["kwargs"][1] == {"num_highlights": 3}
    lines = SHARED_IFEVAL.read_text(encoding="utf-8").splitlines(keepends=True)
    short = tmp_path / "short.jsonl"
    short.write_text("".join(lines[:-1]), encoding="utf-8")
    with pytest.raises(ValueError, match=r"short\.jsonl' has 540 lines; the official file has 541"):
        read_verified(short)
    changed = tmp_path / "changed.jsonl"
    changed.write_text("".join(lines[:-1]) + lines[-1].replace("a", "b", 1), encoding="utf-8")
    with pytest.raises(ValueError, match=rf"changed\.jsonl' has sha256 [0-9a-f]{{64}}; the official file has "
                                         rf"{IFEVAL_SHA256}"):
        read_verified(changed, limit=1)  # the whole file is verified even when only the first n are used


@needs_shared
def test_sources_in_order(tmp_path, monkeypatch):
    monkeypatch.setattr(ifeval_data, "_load_hub", lambda: pytest.fail("the hub must not be asked"))
    records, source = load_ifeval(SHARED_IFEVAL, limit=2)
    assert len(records) == 2 and "EvalConfig.ifeval_data" in source
    copy = tmp_path / "input_data.jsonl"
    shutil.copy(SHARED_IFEVAL, copy)
    monkeypatch.setenv(IFEVAL_ENV, str(copy))
    records, source = load_ifeval(None, limit=1)
    assert records[0]["key"] == 1000 and f"${IFEVAL_ENV}" in source


def test_missing_file_says_where_it_looked_and_how_to_provide(tmp_path, monkeypatch, caplog):
    missing = tmp_path / "nowhere.jsonl"
    with pytest.raises(FileNotFoundError, match=rf"nowhere\.jsonl' does not exist.*{IFEVAL_ENV}"):
        load_ifeval(missing)
    monkeypatch.setenv(IFEVAL_ENV, str(missing))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_ifeval(None)  # a given path never falls back to the hub
    monkeypatch.delenv(IFEVAL_ENV)

    def offline():
        raise ConnectionError("no network")

    monkeypatch.setattr(ifeval_data, "_load_hub", offline)
    with caplog.at_level(logging.WARNING, logger="hat_jax.eval.ifeval"):
        assert load_ifeval(None) is None
    message = caplog.text
    for part in ("IFEval skipped", "EvalConfig.ifeval_data is not set", f"${IFEVAL_ENV} is not set", "google/IFEval",
                 "ConnectionError: no network", "input_data.jsonl", IFEVAL_SHA256):
        assert part in message, part


def test_hub_rows_drop_none_kwargs(monkeypatch):
    row = {"key": 7, "prompt": "p", "instruction_id_list": ["punctuation:no_comma", "keywords:existence"],
           "kwargs": [{"keywords": None, "num_words": None}, {"keywords": ["river"], "num_words": None}]}
    monkeypatch.setattr(ifeval_data, "_load_hub", lambda: [row] * 541)
    records, source = load_ifeval(None, limit=2)
    assert source == "hub google/IFEval" and records[0]["kwargs"] == [{}, {"keywords": ["river"]}]
    monkeypatch.setattr(ifeval_data, "_load_hub", lambda: [row] * 3)
    with pytest.raises(ValueError, match="has 3 rows; the official set has 541"):
        load_ifeval(None)


def test_bad_record_is_named(tmp_path, monkeypatch):
    bad = {"key": 1, "prompt": "p", "instruction_id_list": ["a", "b"], "kwargs": [{}]}
    monkeypatch.setattr(ifeval_data, "_load_hub", lambda: [json.loads(json.dumps(bad))] * 541)
    with pytest.raises(ValueError, match=r"google/IFEval\[0\]: 2 instruction ids but 1 kwargs"):
        load_ifeval(None)
