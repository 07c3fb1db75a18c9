"""Constraint texts and checks, on hand-checked replies and call orders."""

import pytest

from hat_jax.harness.constraints import (
    CONSTRAINT_REGISTRY,
    check_all,
    check_constraint,
    check_episode,
    constraint_text,
)
from hat_jax.harness.state import Constraint, Tool
from hat_jax.sim.types import Episode, Task, ToolCallRecord
from hat_jax.sim.world_harness import production_harness

C = Constraint


@pytest.mark.parametrize(
    "constraint, reply, ok",
    [
        (C("max_chars", {"n": 5}), " 宝宝你好呀 ", True),
        (C("max_chars", {"n": 4}), "宝宝你好呀", False),
        (C("min_chars", {"n": 3}), "好的", False),
        (C("must_include", {"phrase": "直播价"}), "直播价99元", True),
        (C("must_include", {"phrase": "直播价"}), "价格99元", False),
        (C("address_term", {"term": "宝宝"}), "宝宝，有货", True),
        (C("address_term", {"term": "宝宝"}), "亲，有货", False),
        (C("start_with", {"phrase": "宝宝"}), "  宝宝好", True),
        (C("end_with", {"phrase": "哦"}), "有货哦\n", True),
        (C("end_with", {"phrase": "哦"}), "有货哦。", False),
        (C("forbidden_phrase", {"phrase": "亲"}), "亲，有货", False),
        (C("no_exclamation", {}), "有货！", False),
        (C("no_exclamation", {}), "有货!", False),
        (C("no_exclamation", {}), "有货。", True),
        (C("no_emoji", {}), "有货😊", False),
        (C("no_emoji", {}), "有货~", True),
        (C("no_bullets", {}), "宝宝：\n- 红色有货\n- 蓝色无货", False),
        (C("no_bullets", {}), "1. 红色有货", False),
        (C("no_bullets", {}), "宝宝，红色有货，直播价-20元", True),
    ],
)
def test_reply_checks(constraint, reply, ok):
    assert check_constraint(constraint, reply) is ok


@pytest.mark.parametrize(
    "calls, ok",
    [
        (["load_skill", "get_product_detail", "get_stock"], True),
        (["load_skill", "get_stock", "get_product_detail"], False),
        (["get_stock"], False),
        (["load_skill", "get_price"], True),  # get_stock never called: vacuous
        ([], True),
    ],
)
def test_tool_order(calls, ok):
    assert check_constraint(C("tool_order", {"first": "get_product_detail", "then": "get_stock"}), "回复", calls) is ok


def test_texts_use_current_surface_names():
    h = production_harness()
    order = C("tool_order", {"first": "get_product_detail", "then": "get_stock"})
    assert constraint_text(order, h) == "先调用 get_product_detail，再调用 get_stock。"
    renamed = h.replace(
        tools=tuple(
            Tool("chaKuCun", t.description, t.input_schema, t.impl, t.arg_paths) if t.impl == "get_stock" else t
            for t in h.tools
        )
    )
    assert constraint_text(order, renamed) == "先调用 get_product_detail，再调用 chaKuCun。"
    assert constraint_text(C("max_chars", {"n": 120})) == "回复不超过120字。"
    assert constraint_text(C("address_term", {"term": "宝宝"})) == "称呼观众为“宝宝”。"
    with pytest.raises(ValueError, match="needs the harness"):
        constraint_text(order)
    with pytest.raises(KeyError, match="no tool of harness 'production' is bound to impl 'get_weather'"):
        constraint_text(C("tool_order", {"first": "get_weather", "then": "get_stock"}), h)
    with pytest.raises(KeyError, match="unknown constraint id 'be_brief'"):
        check_constraint(C("be_brief"), "x")


def test_check_all_on_production():
    h = production_harness()
    good = "宝宝，这款直播价199元，现在下单还送运费险。"
    assert [ok for _, ok in check_all(h, good, ["load_skill", "get_price"])] == [True, True, True, True]
    bad = "亲：\n- 直播价199元"
    assert [(c.id, ok) for c, ok in check_all(h, bad, ["get_stock", "get_product_detail"])] == [
        ("tool_order", False),
        ("max_chars", True),
        ("address_term", False),
        ("no_bullets", False),
    ]


def test_every_template_formats():
    for cid, spec in CONSTRAINT_REGISTRY.items():
        kwargs = {k: 3 if v.get("type") == "integer" else "词" for k, v in spec.params_schema["properties"].items()}
        if cid == "tool_order":
            kwargs = {"first": "get_price", "then": "get_stock"}
            assert constraint_text(C(cid, kwargs), production_harness())
        else:
            assert "{" not in constraint_text(C(cid, kwargs))


def test_check_episode_uses_reply_and_call_impls():
    h = production_harness()
    task = Task("live-000001", 0, "stock", "黑色M码还有吗？", "product_qa")
    pairs = [("get_stock", "get_stock"), ("x", "get_product_detail")]
    calls = tuple(ToolCallRecord(1, name, impl, {}, {}, "ok", {}) for name, impl in pairs)
    episode = Episode(task, h.version, (), calls, reply="宝宝，还有12件哦。")
    assert [(c.id, ok) for c, ok in check_episode(episode, h)] == [
        ("tool_order", False),
        ("max_chars", True),
        ("address_term", True),
        ("no_bullets", True),
    ]
