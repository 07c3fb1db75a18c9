"""The hand-labelled set and the judges' agreement with it (hat_jax.judges.agreement)."""

import math

import pytest

from hat_jax.judges.agreement import cohen_kappa, judge_agreement, label_harness, load_hand_labels
from hat_jax.sim.types import INTENTS


def test_cohen_kappa_hand_example():
    # p_o = 4/5; marginals (3,2) and (2,3): p_e = (3*2 + 2*3)/25 = 0.48; kappa = 0.32/0.52
    assert cohen_kappa([1, 1, 0, 0, 1], [1, 0, 0, 0, 1]) == pytest.approx(0.32 / 0.52)
    assert cohen_kappa([0.5, 1, 0], [0.5, 1, 0]) == 1.0
    assert math.isnan(cohen_kappa([1, 1], [1, 1]))
    with pytest.raises(ValueError, match="equal-length"):
        cohen_kappa([1], [1, 0])


def test_hand_labels_cover_the_intents_and_harness():
    items = load_hand_labels()
    assert len(items) == 64
    assert {x.episode.task.intent for x in items} == set(INTENTS)
    assert all({"accuracy", "effectiveness"} <= set(x.labels) for x in items)
    h = label_harness()
    assert all(s in {sk.name for sk in h.skills} for x in items for s in x.episode.loaded_skills)


def test_hand_labels_bad_records_are_named():
    with pytest.raises(ValueError, match="'x' lacks 'labels'"):
        load_hand_labels("episodes: [{id: x, task: {}}]")
    with pytest.raises(ValueError, match="unknown metrics \\['vibes'\\]"):
        load_hand_labels("episodes: [{id: x, task: {intent: price, message: m, skill_key: k}, labels: {vibes: 1}}]")
    with pytest.raises(ValueError, match="calls\\[0\\]"):
        load_hand_labels("episodes: [{id: x, task: {intent: price, message: m, skill_key: k}, calls: [[a]], labels: {}}]")


def test_judge_agreement_measured_figures():
    """The figures measured on the 64 hand-labelled episodes (the hand labels are kept where the judges differ)."""
    got = judge_agreement()
    summary = {m: (v["n"], v["agree"], round(v["percent"], 2), round(v["kappa"], 4)) for m, v in got.items()}
    assert summary == {
        "accuracy": (64, 62, 96.88, 0.9322),
        "effectiveness": (64, 61, 95.31, 0.917),
        "adr": (64, 62, 96.88, 0.8976),
        "rc": (64, 64, 100.0, 1.0),
        "tc": (64, 64, 100.0, 1.0),
        "llm": (64, 64, 100.0, 1.0),
        "tco": (64, 64, 100.0, 1.0),
        "tool_rationality": (64, 64, 100.0, 1.0),
        "skill_selection": (64, 64, 100.0, 1.0),
    }
    assert got["accuracy"]["disagree"] == ["compare-diff", "offtopic-distractor"]
    assert got["effectiveness"]["disagree"] == ["stock-invalid-args", "compare-diff", "aftersales-refund-promise"]
    assert got["adr"]["disagree"] == ["compare-diff", "aftersales-refund-promise"]
