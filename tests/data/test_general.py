"""IFEval-style general prompts: official record shape and ids, disjoint splits, responses that pass."""

import json
import random
from itertools import combinations
from pathlib import Path

import pytest

from hat_jax.data import general
from hat_jax.data.general import (
    INSTRUCTION_IDS,
    GeneralPrompt,
    check_instruction,
    check_prompt,
    general_prompts,
    general_response,
)

# kwarg names per id, copied by hand from the official registry (if-verifiable 0.1.2,
# instructions.py get_instruction_args_keys): the records must use exactly these.
OFFICIAL_ARG_KEYS = {
    "change_case:english_lowercase": set(),
    "change_case:english_capital": set(),
    "punctuation:no_comma": set(),
    "keywords:existence": {"keywords"},
    "keywords:forbidden_words": {"forbidden_words"},
    "startend:end_checker": {"end_phrase"},
    "startend:quotation": set(),
    "detectable_format:number_bullet_lists": {"num_bullets"},
    "length_constraints:number_words": {"num_words", "relation"},
    "length_constraints:number_sentences": {"num_sentences", "relation"},
    "combination:repeat_prompt": {"prompt_to_repeat"},
    "detectable_content:postscript": {"postscript_marker"},
}
OFFICIAL_DATA = Path(__file__).resolve().parents[3] / "shared" / "ifeval" / "input_data.jsonl"


@pytest.fixture(scope="module")
def train():
    return general_prompts(600, seed=0)


@pytest.fixture(scope="module")
def evals():
    return general_prompts(300, seed=0, split="eval")


def test_records_have_the_official_shape_ids_and_kwarg_names(train):
    for p in train:
        rec = p.to_record()
        assert list(rec) == ["key", "prompt", "instruction_id_list", "kwargs"]
        assert json.loads(json.dumps(rec)) == rec
        assert 1 <= len(p.instruction_id_list) <= 3 and len(p.kwargs) == len(p.instruction_id_list)
        for iid, kw in zip(p.instruction_id_list, p.kwargs, strict=True):
            assert set(kw) == OFFICIAL_ARG_KEYS[iid], (iid, kw)
            if "relation" in kw:
                assert kw["relation"] in ("less than", "at least")
            if "postscript_marker" in kw:
                assert kw["postscript_marker"] in ("P.S.", "P.P.S")
            if "keywords" in kw:
                assert kw["keywords"] == sorted(kw["keywords"])
    assert {i for p in train for i in p.instruction_id_list} == set(INSTRUCTION_IDS)
    assert [p.key for p in train[:3]] == [100000, 100001, 100002]


def test_record_keys_match_the_official_file_when_present():
    if not OFFICIAL_DATA.is_file():
        pytest.skip(f"{OFFICIAL_DATA} not present")
    first = json.loads(OFFICIAL_DATA.read_text(encoding="utf-8").splitlines()[0])
    assert list(first) == list(general_prompts(1, 0)[0].to_record())
    official = {json.loads(line)["prompt"] for line in OFFICIAL_DATA.read_text(encoding="utf-8").splitlines()}
    ours = {p.prompt for p in general_prompts(500, 0)} | {p.prompt for p in general_prompts(200, 0, "eval")}
    assert not official & ours


def test_no_prompt_combines_officially_conflicting_instructions(train, evals):
    for p in train + evals:
        ids = p.instruction_id_list
        assert len(set(ids)) == len(ids)
        if "combination:repeat_prompt" in ids:  # official: repeat_prompt conflicts with all but these two
            assert set(ids) <= {"combination:repeat_prompt", "keywords:existence", "punctuation:no_comma"}
        assert not {"change_case:english_lowercase", "change_case:english_capital"} <= set(ids)
        for a, b in combinations(ids, 2):
            assert not general._conflicts(a, b)


def test_repeat_prompt_kwarg_is_the_request_before_the_official_sentence(train):
    repeats = [p for p in train if "combination:repeat_prompt" in p.instruction_id_list]
    assert repeats
    for p in repeats:
        to_repeat = p.kwargs[p.instruction_id_list.index("combination:repeat_prompt")]["prompt_to_repeat"]
        assert p.prompt == to_repeat + "\n" + general._REPEAT_TEXT


def test_deterministic_per_seed_and_split():
    assert general_prompts(50, 3) == general_prompts(50, 3)
    assert general_prompts(50, 3) != general_prompts(50, 4)
    assert general_prompts(20, 3, "eval") == general_prompts(20, 3, "eval")


def test_train_and_eval_share_no_prompt_string_or_key():
    train = general_prompts(2000, seed=1)
    evals = general_prompts(400, seed=1, split="eval")
    assert len({p.prompt for p in train}) == 2000 and len({p.prompt for p in evals}) == 400
    assert not {p.prompt for p in train} & {p.prompt for p in evals}
    assert not {p.key for p in train} & {p.key for p in evals}
    assert not set(general.TRAIN_TOPICS) & set(general.EVAL_TOPICS)


def test_rule_based_responses_follow_every_instruction(train, evals):
    for p in train + evals:
        for seed in (0, 1):
            response = general_response(p, random.Random(seed))
            assert all(check_prompt(p, response)), (p.to_record(), response)


def test_response_hand_checked_example():
    p = GeneralPrompt(
        key=1,
        prompt="Write a short note about baking bread. Answer with less than 40 words.",
        instruction_id_list=["change_case:english_lowercase", "detectable_format:number_bullet_lists",
                             "startend:end_checker"],
        kwargs=[{}, {"num_bullets": 2}, {"end_phrase": "Any other questions?"}],
    )  # fmt: skip
    text = general_response(p, random.Random(0))
    assert text == text.lower() and text.endswith("any other questions?")
    assert sum(line.startswith("* ") for line in text.splitlines()) == 2


@pytest.mark.parametrize(
    ("iid", "kwargs", "good", "bad"),
    [
        ("change_case:english_lowercase", {}, "all lower here.", "Not lower."),
        ("change_case:english_capital", {}, "ALL CAPS HERE.", "ALL CAPS bUT ONE."),
        ("punctuation:no_comma", {}, "no commas here", "one, comma"),
        ("keywords:existence", {"keywords": ["river", "Teacup"]}, "A teacup by the RIVER.", "Only a river."),
        ("keywords:forbidden_words", {"forbidden_words": ["good"]}, "Goodness me.", "It is GOOD."),
        ("startend:end_checker", {"end_phrase": "Any other questions?"},
         '"Done. any other questions?"', "Any other questions? Yes."),
        ("startend:quotation", {}, ' "quoted" ', '"half'),
        ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "Intro:\n* a\n- b", "* a\n* b\n* c"),
        ("detectable_format:number_bullet_lists", {"num_bullets": 1}, "* a\n**bold** line", "**bold** only"),
        ("length_constraints:number_words", {"num_words": 4, "relation": "less than"},
         "one two, three", "one two three four"),
        ("length_constraints:number_words", {"num_words": 4, "relation": "at least"}, "it's one two", "one two three"),
        ("length_constraints:number_sentences", {"num_sentences": 2, "relation": "at least"},
         "One. Two!", "Only one here."),
        ("length_constraints:number_sentences", {"num_sentences": 3, "relation": "less than"}, "One. Two?", "A. B. C."),
        ("combination:repeat_prompt", {"prompt_to_repeat": "Write a note."},
         "write a NOTE.\n\nHi.", "Sure. Write a note."),
        ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Hi.\n\np.s. bye", "Hi. PS bye"),
        ("detectable_content:postscript", {"postscript_marker": "P.P.S"}, "Hi.\nP. P. S later", "Hi.\nP.S. later"),
    ],
)  # fmt: skip
def test_checkers_on_hand_made_cases(iid, kwargs, good, bad):
    assert check_instruction(iid, kwargs, good) is True
    assert check_instruction(iid, kwargs, bad) is False


def test_bad_input_raises_clear_errors():
    with pytest.raises(ValueError, match="split"):
        general_prompts(3, 0, split="dev")
    with pytest.raises(ValueError, match="n must be"):
        general_prompts(-1, 0)
    with pytest.raises(KeyError, match="language:response_language"):
        check_instruction("language:response_language", {"language": "en"}, "hi")
    foreign = GeneralPrompt(key=1, prompt="Summarise this paper.", instruction_id_list=[], kwargs=[])
    with pytest.raises(ValueError, match="base requests"):
        general_response(foreign, random.Random(0))
    impossible = GeneralPrompt(
        key=2,
        prompt="Write a short note about baking bread.",
        instruction_id_list=["detectable_format:number_bullet_lists", "length_constraints:number_words"],
        kwargs=[{"num_bullets": 4}, {"num_words": 5, "relation": "less than"}],
    )
    with pytest.raises(ValueError, match="no response satisfies"):
        general_response(impossible, random.Random(0))
