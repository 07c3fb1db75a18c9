"""Task sampling: every intent, determinism per (seed, index), gold plans that run and find the product."""

import collections

import pytest

from hat_jax.sim.tools import call_world_function, recommend_size
from hat_jax.sim.types import INTENTS, SKILL_KEYS
from hat_jax.sim.viewers import INTENT_SKILL, TEMPLATES, _redundant_prefix, sample_task, sample_tasks

TOOL_FREE = ("identity", "chit_chat", "off_topic", "prompt_injection")


def test_templates_and_skills_cover_intents():
    per_intent = collections.Counter(k.split(":")[0] for k in TEMPLATES for _ in TEMPLATES[k])
    assert set(per_intent) == set(INTENTS) and len(INTENTS) >= 12
    assert min(per_intent.values()) >= 4
    assert set(INTENT_SKILL) == set(INTENTS) and set(INTENT_SKILL.values()) == set(SKILL_KEYS)


def test_deterministic_per_seed_and_index(world):
    tasks = sample_tasks(world, 40, seed=3)
    assert tasks == sample_tasks(world, 40, seed=3)
    assert tasks[:10] == sample_tasks(world, 10, seed=3)
    assert tasks[17] == sample_task(world, 3, 17)
    assert tasks != sample_tasks(world, 40, seed=4)
    assert len({t.task_id for t in tasks}) == 40 and tasks[5].task_id == "live-3-000005"
    assert len({t.seed for t in tasks}) == 40


def test_intent_mix_and_weights(world):
    tasks = sample_tasks(world, 650, seed=0)
    counts = collections.Counter(t.intent for t in tasks)
    assert set(counts) == set(INTENTS) and min(counts.values()) > 25
    only = sample_tasks(world, 50, seed=0, intents=["price", "stock"], weights=[1.0, 0.0])
    assert {t.intent for t in only} == {"price"}
    with pytest.raises(ValueError, match="unknown"):
        sample_tasks(world, 1, seed=0, intents=["haggle"])
    with pytest.raises(ValueError, match="weights"):
        sample_tasks(world, 1, seed=0, intents=["price"], weights=[1.0, 2.0])


@pytest.mark.parametrize("intent", INTENTS)
def test_gold_plans_run_and_search_finds_the_product(world, intent):
    for task in sample_tasks(world, 500, seed=11, intents=[intent]):
        assert task.skill_key == INTENT_SKILL[intent] and task.message
        if intent in TOOL_FREE:
            assert task.gold_calls == () and task.gold_facts == {} and task.product_ids == ()
            continue
        searches = [args["query"] for rnd in task.gold_calls for impl, args in rnd if impl == "search_products"]
        assert len(searches) == len(task.product_ids)
        for query, pid in zip(searches, task.product_ids, strict=True):
            assert query in task.message
            assert call_world_function(world, "search_products", {"query": query})["products"][0]["product_id"] == pid
        for rnd in task.gold_calls:
            for impl, args in rnd:
                call_world_function(world, impl, args)  # no ToolError
        assert task.gold_facts and all(isinstance(v, (str, int, float)) for v in task.gold_facts.values())


def test_behaviours(world):
    by_intent = {t.intent: t for t in sample_tasks(world, 300, seed=1)}
    assert by_intent["identity"].behaviour == "disclose_ai"
    assert by_intent["prompt_injection"].behaviour == "refuse"
    assert by_intent["off_topic"].behaviour == "deflect"
    assert by_intent["complaint"].behaviour == "apologise_and_answer"
    assert by_intent["price"].behaviour == "answer"


def test_facts_hand_checked(world):
    for t in sample_tasks(world, 60, seed=5, intents=["size_advice", "stock", "comparison", "price"]):
        p = world.product(t.product_ids[0])
        if t.intent == "size_advice":
            assert t.gold_facts == {
                "recommended_size": recommend_size(p.size_chart, t.slots["height_cm"], t.slots["weight_kg"])[0]
            }
            assert str(t.slots["height_cm"]) in t.message
        elif t.intent == "stock":
            sku = world.sku(t.slots["sku_id"])[1]
            assert t.gold_facts == {"stock": sku.stock, "in_stock": sku.stock > 0}
            assert sku.v1 in t.message and sku.v2 in t.message
            assert [impl for rnd in t.gold_calls for impl, _ in rnd] == [
                "search_products",
                "get_product_detail",
                "get_stock",
            ]
        elif t.intent == "comparison":
            b = world.product(t.product_ids[1])
            assert t.gold_facts == {"live_price_1": p.live_price, "live_price_2": b.live_price}
            assert [len(rnd) for rnd in t.gold_calls] == [2, 2] and p.category == b.category
        else:
            assert t.gold_facts == {"live_price": p.live_price}


def test_polite_prefix_never_repeats_the_opening(world):
    assert _redundant_prefix("请问", "请问连衣裙的产地在哪") and _redundant_prefix("宝宝问一下，", "想问下连衣裙的材质")
    assert not _redundant_prefix("请问", "连衣裙多少钱？") and not _redundant_prefix("", "请问连衣裙的产地在哪")
    tasks = sample_tasks(world, 5000, seed=1)
    for t in tasks:
        for p in ("请问", "宝宝问一下，"):  # a question prefix is never followed by another question opener
            rest = t.message[len(p):] if t.message.startswith(p) else ""
            assert not rest.startswith(("请问", "想问", "问一下", "问下")), t.message
        assert not t.message.startswith("主播，主播"), t.message
    # the prefix is still drawn: templates opening with 请问 keep it once
    assert any(t.message.startswith("请问") and t.slots["template"].startswith("请问") for t in tasks)
    assert any(t.message.startswith("宝宝问一下，") for t in tasks)
