"""The four live-stream evaluation suites: held-out items, perturbations, and the ideal oracle's scores."""

import json

import pytest

from hat_jax.data import suites
from hat_jax.harness.hsa import is_heldout_harness
from hat_jax.harness.render import render_system_prompt
from hat_jax.judges.rules import judge_episode
from hat_jax.sim.catalog import World
from hat_jax.sim.env import LiveStreamEnv
from hat_jax.sim.oracle import OracleTeacher
from hat_jax.sim.rollout import rollout
from hat_jax.sim.world_harness import production_harness

N = 24


@pytest.fixture(scope="module")
def items(world):
    exclude = suites.training_messages(world, 300, (1, 2))
    return {s: suites.build_suite(world, s, N, exclude=exclude) for s in suites.SUITES}


def test_items_are_deterministic_and_round_trip(world, items):
    exclude = suites.training_messages(world, 300, (1, 2))
    for suite in suites.SUITES:
        again = suites.build_suite(world, suite, N, exclude=exclude)
        assert again == items[suite]
        assert [suites.item_from_dict(json.loads(json.dumps(suites.item_to_dict(i)))) for i in again] == again
    assert suites.build_suite(world, "live_qa", N, seed=1) != items["live_qa"]


def test_eval_messages_are_held_out(world, items):
    train = suites.training_messages(world, 300, (1, 2))
    for suite, its in items.items():
        messages = [i.task.message for i in its]
        assert not set(messages) & train and len(set(messages)) == N, suite


def test_perturbations(items):
    original = production_harness()
    assert all(suites.item_harness(i, original) is original for i in items["live_qa"])
    for item in items["variant_qa"]:
        h = suites.item_harness(item, original)
        assert h.family == "hsa-heldout" and is_heldout_harness(h, original)
    kinds = [i.perturbation for i in items["tool_robustness"]]
    assert set(kinds) == set(suites.TOOL_PERTURBATIONS)
    for item in items["tool_robustness"]:
        h = suites.item_harness(item, original)
        if item.perturbation == "tool_failure":
            assert h is original and suites.item_env_config(item).fault_rates == suites.TOOL_FAILURE_RATES
        elif item.perturbation == "distractor_tools":
            assert 2 <= len(h.tools) - len(original.tools) <= 4
        else:
            assert {t.name for t in h.tools} != {t.name for t in original.tools}
    for item in items["prompt_robustness"]:
        h = suites.item_harness(item, original)
        assert h.sections[-1].title == suites.EXTRA_SECTION_TITLE and h.constraints()[-len(item.constraints):] == item.constraints
        assert suites.EXTRA_SECTION_TITLE in render_system_prompt(h)


def test_tool_order_constraint_enters_the_gold_plan(items):
    ordered = [i for i in items["prompt_robustness"] if any(c.id == "tool_order" for c in i.constraints)]
    assert len(ordered) >= N // 2
    for item in ordered:
        kw = next(c.kwargs for c in item.constraints if c.id == "tool_order")
        impls = [impl for group in item.task.gold_calls for impl, _ in group]
        assert impls.index(kw["first"]) < impls.index(kw["then"])


def test_with_tool_order_hand_case():
    from hat_jax.sim.types import Task

    task = Task("t", 0, "price", "多少钱", "price_promotion", ("P0001",),
                gold_calls=((("search_products", {"query": "x"}),), (("get_price", {"product_id": "P0001"}),)))
    new = suites._with_tool_order(task, "get_promotions", "get_price")
    assert new.gold_calls == (
        (("search_products", {"query": "x"}),),
        (("get_promotions", {"product_id": "P0001"}),),
        (("get_price", {"product_id": "P0001"}),),
    )


def test_ideal_oracle_scores_full_marks_on_every_suite(world, items):
    """The noise-free oracle reads each item's harness: it gets every suite metric right, except where
    injected tool failures leave nothing to ground an answer on."""
    original = production_harness()
    oracle = OracleTeacher(world)
    for suite, its in items.items():
        for item in its:
            h = suites.item_harness(item, original)
            episode = rollout(LiveStreamEnv(world, suites.item_env_config(item)), oracle, item.task, h)
            scores = judge_episode(episode, h).scores()
            if item.perturbation == "tool_failure":
                assert scores["adr"] == 1, (item.item_id, scores)
                continue
            assert all(scores[m] == 1 for m in item.metrics), (item.item_id, scores)


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown 'qa'"):
        suites.build_suite(World.generate(0, 200), "qa", 3)
    with pytest.raises(ValueError, match="unknown suite"):
        suites.item_from_dict({"suite": "qa", "item_id": "x", "task": {}})
