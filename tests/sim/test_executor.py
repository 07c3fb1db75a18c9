"""execute_tool_call: lookup, schema validation, arg-path mapping, skills, faults, business errors."""

import json
import random

import pytest

from hat_jax.harness.state import HarnessState, Skill, Tool
from hat_jax.sim.executor import draw_fault, execute_tool_call
from hat_jax.sim.world_harness import production_harness


@pytest.fixture(scope="module")
def prod():
    return production_harness()


@pytest.fixture(scope="module")
def renamed():
    """A harness whose price tool is renamed and nests its argument; a distractor; a skill tool without arg_paths."""
    price = Tool(
        "查价",
        "查价格",
        {
            "type": "object",
            "properties": {
                "item": {"type": "object", "properties": {"pid": {"type": "string"}}, "required": ["pid"]},
                "verbose": {"type": "boolean"},
            },
            "required": ["item"],
        },
        impl="get_price",
        arg_paths={"product_id": ("item", "pid")},
    )
    skills_tool = Tool(
        "open_skill",
        "加载技能",
        {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]},
        impl="load_skill",
    )
    weather = Tool(
        "weather_now",
        "天气",
        {"type": "object", "properties": {"city": {"type": "string"}}},
        impl="distractor:weather_now",
    )
    skill = Skill("pricing-v2", "价格", "# 价格\n先查价。", ("查价",), key="price_promotion")
    return HarnessState("test", "0", "open_skill", (skill,), (price, skills_tool, weather), ())


def test_ok_call(world, prod):
    ex = execute_tool_call(world, prod, "get_price", {"product_id": "P0001"})
    assert ex.status == "ok" and ex.impl == "get_price" and ex.canonical_args == {"product_id": "P0001"}
    assert ex.result["live_price"] == 188.9
    status, result, canonical, impl = ex  # a plain tuple too
    assert status == "ok"


def test_unknown_tool(world, prod):
    ex = execute_tool_call(world, prod, "get_prices", {"product_id": "P0001"})
    assert ex.status == "unknown_tool" and ex.impl == "" and ex.canonical_args == {}
    err = ex.result["error"]
    assert (
        err["type"] == "unknown_tool"
        and "get_prices" in err["message"]
        and "get_price" in err["details"]["available_tools"]
    )


def test_invalid_arguments_list_paths(world, prod):
    ex = execute_tool_call(world, prod, "get_size_chart", {"height_cm": "170"})
    assert ex.status == "invalid_arguments" and ex.canonical_args == {}
    paths = [e["path"] for e in ex.result["error"]["details"]["errors"]]
    assert paths == ["(root)", "height_cm"]
    assert "product_id" in ex.result["error"]["message"] and "height_cm" in ex.result["error"]["message"]
    assert execute_tool_call(world, prod, "get_price", ["P0001"]).status == "invalid_arguments"


def test_json_text_arguments(world, prod):
    assert execute_tool_call(world, prod, "get_price", '{"product_id": "P0002"}').status == "ok"
    bad = execute_tool_call(world, prod, "get_price", '{"product_id": ')
    assert bad.status == "invalid_arguments" and bad.result["error"]["details"]["errors"][0]["path"] == "(root)"


def test_nested_arg_paths_and_extra_args(world, renamed):
    ex = execute_tool_call(world, renamed, "查价", {"item": {"pid": "P0003"}, "verbose": True})
    assert ex.status == "ok" and ex.canonical_args == {"product_id": "P0003"}
    assert ex.result["live_price"] == world.product("P0003").live_price
    bad = execute_tool_call(world, renamed, "查价", {"item": {}})
    assert bad.result["error"]["details"]["errors"][0] == {"path": "item", "message": "'pid' is a required property"}


def test_business_error(world, prod):
    ex = execute_tool_call(world, prod, "get_price", {"product_id": "P9999"})
    assert (
        ex.status == "error" and ex.result["error"]["type"] == "not_found" and "P9999" in ex.result["error"]["message"]
    )
    ex = execute_tool_call(world, prod, "estimate_shipping", {"product_id": "P0001", "region": "台湾"})
    assert ex.status == "error" and ex.result["error"]["type"] == "not_served"


def test_skill_loading(world, prod, renamed):
    ex = execute_tool_call(world, prod, "load_skill", {"skill": "logistics"})
    assert (
        ex.status == "ok" and ex.result["skill"] == "logistics" and ex.result["content"] == prod.skill("logistics").body
    )
    ex = execute_tool_call(world, renamed, "open_skill", {"id": "pricing-v2"}, fault="error")  # never faulted
    assert ex.status == "ok" and ex.result == {"skill": "pricing-v2", "content": "# 价格\n先查价。"}
    ex = execute_tool_call(world, renamed, "open_skill", {"id": "pricing"})
    assert ex.status == "error" and ex.result["error"]["details"]["valid_skills"] == ["pricing-v2"]


def test_enum_rejects_unknown_skill(world, prod):
    ex = execute_tool_call(world, prod, "load_skill", {"skill": "shipping"})
    assert ex.status == "invalid_arguments"  # the production schema enumerates the skill ids


def test_distractor(world, renamed):
    ex = execute_tool_call(world, renamed, "weather_now", {"city": "杭州"})
    assert ex.status == "ok" and ex.impl == "distractor:weather_now" and ex.result["tool"] == "weather_now"


def test_faults(world, prod):
    args = {"product_id": "P0001"}
    err = execute_tool_call(world, prod, "get_price", args, fault="error")
    assert err.status == "error" and err.result["error"]["type"] == "service_error" and err.canonical_args == args
    out = execute_tool_call(world, prod, "get_price", args, fault="timeout")
    assert out.status == "timeout" and out.result["error"]["type"] == "timeout"
    assert execute_tool_call(world, prod, "get_price", args, fault="empty")[:2] == ("empty", {})
    # a model mistake is reported as such, not masked by a fault
    assert execute_tool_call(world, prod, "get_price", {}, fault="error").status == "invalid_arguments"
    with pytest.raises(ValueError, match="fault"):
        execute_tool_call(world, prod, "get_price", args, fault="crash")


def test_draw_fault():
    rng = random.Random(0)
    assert {draw_fault(rng, {"error": 0.0, "timeout": 0.0, "empty": 0.0}) for _ in range(100)} == {None}
    assert draw_fault(rng, {"timeout": 1.0}) == "timeout"
    draws = [draw_fault(random.Random(i), {"error": 0.2, "timeout": 0.1, "empty": 0.1}) for i in range(2000)]
    assert abs(draws.count("error") / 2000 - 0.2) < 0.03 and abs(draws.count(None) / 2000 - 0.6) < 0.04
    assert draws == [draw_fault(random.Random(i), {"error": 0.2, "timeout": 0.1, "empty": 0.1}) for i in range(2000)]
    with pytest.raises(ValueError, match="unknown"):
        draw_fault(rng, {"crash": 0.1})
    with pytest.raises(ValueError, match="sum"):
        draw_fault(rng, {"error": 0.8, "empty": 0.5})


# --- nothing the model writes escapes as an exception -----------------------------------------

ODD_VALUES = [
    "",
    "   ",
    "\x00",
    "x" * 5000,
    10**30,
    -(10**30),
    -5,
    0,
    2.0,
    1e308,
    float("nan"),
    float("inf"),
    True,
    None,
    [],
    ["P0001"],
    {},
    {"a": {"b": {"c": None}}},
]


def test_empty_search_query_is_a_structured_invalid_arguments_error(world, prod):
    for query in ("", "   "):
        ex = execute_tool_call(world, prod, "search_products", {"query": query})
        assert ex.status == "invalid_arguments" and ex.canonical_args == {"query": query}
        assert ex.result["error"]["details"]["errors"] == [{"path": "query", "message": "搜索关键词不能为空（query）"}]
    # the canonical path is reported at the surface path of a renamed, nested tool
    search = Tool(
        "find",
        "搜",
        {"type": "object", "properties": {"q": {"type": "object", "properties": {"text": {"type": "string"}}}}},
        impl="search_products",
        arg_paths={"query": ("q", "text")},
    )
    h = HarnessState("t", "0", "find", (), (search,), ())
    ex = execute_tool_call(world, h, "find", {"q": {"text": " "}})
    assert ex.status == "invalid_arguments" and ex.result["error"]["details"]["errors"][0]["path"] == "q.text"


def test_integral_float_for_an_integer_argument_is_used_as_an_int(world, prod):
    ex = execute_tool_call(world, prod, "search_products", {"query": "连衣裙", "max_results": 2.0})
    assert ex.status == "ok" and len(ex.result["products"]) == 2  # JSON Schema counts 2.0 as an integer
    assert execute_tool_call(world, prod, "search_products", {"query": "连衣裙", "max_results": 2.5}).status == (
        "invalid_arguments"
    )


def test_every_tool_error_shape_and_world_bug_becomes_a_structured_result(world, prod, monkeypatch):
    from hat_jax.sim import tools as T

    def install(fn):
        monkeypatch.setitem(T.WORLD_FUNCTIONS, "get_price", T.WorldFunction("get_price", fn, {}, ""))

    def no_details(world, product_id):
        raise T.ToolError("坏了", kind="invalid_arguments")

    install(no_details)
    ex = execute_tool_call(world, prod, "get_price", {"product_id": "P0001"})
    assert ex.status == "invalid_arguments"
    assert ex.result["error"]["details"]["errors"] == [{"path": "(root)", "message": "坏了"}]

    def odd_details(world, product_id):
        raise T.ToolError("坏了", kind="invalid_arguments", details={"errors": [3, {"path": "product_id"}]})

    install(odd_details)
    ex = execute_tool_call(world, prod, "get_price", {"product_id": "P0001"})
    assert ex.result["error"]["details"]["errors"] == [
        {"path": "(root)", "message": "3"},
        {"path": "product_id", "message": "坏了"},
    ]

    def bug(world, product_id):
        raise ZeroDivisionError("division by zero")

    install(bug)
    ex = execute_tool_call(world, prod, "get_price", {"product_id": "P0001"})
    assert ex.status == "error" and ex.result["error"]["type"] == "internal_error"
    assert ex.result["error"]["details"] == {"exception": "ZeroDivisionError: division by zero"}


def test_a_schema_the_validator_cannot_evaluate_is_a_structured_error(world):
    broken = Tool(
        "get_stock",
        "库存",
        {"type": "object", "properties": {"sku_id": {"$ref": "#/$defs/nowhere"}}, "required": ["sku_id"]},
        impl="get_stock",
        arg_paths={"sku_id": ("sku_id",)},
    )
    h = HarnessState("t", "0", "get_stock", (), (broken,), ())
    ex = execute_tool_call(world, h, "get_stock", {"sku_id": "P0001-黑色-M"})
    assert ex.status == "error" and ex.result["error"]["type"] == "invalid_schema" and ex.canonical_args == {}
    assert "nowhere" in ex.result["error"]["details"]["reason"]


def test_a_tool_name_that_is_not_a_string_is_an_unknown_tool(world, prod):
    for name in (None, 5, ["get_price"], {"name": "get_price"}):
        assert execute_tool_call(world, prod, name, {"product_id": "P0001"}).status == "unknown_tool"


def _fuzz_harnesses(prod):
    from hat_jax.harness import hsa

    yield prod
    for seed in range(3):  # renamed, nested and distractor arguments too
        yield hsa.compose(prod, random.Random(seed), hsa.HSAConfig(default_p=1.0))[0]


def _place(path, value, base):
    out = json.loads(json.dumps(base))
    node = out
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    return out


def test_fuzzed_arguments_never_raise_out_of_the_executor(world, prod):
    from hat_jax.harness.hsa_rewrite import leaf_paths

    seen = set()
    for h in _fuzz_harnesses(prod):
        for tool in h.tools:
            valid = {}  # a valid call to start from: every leaf set to a plausible value
            for path in leaf_paths(tool.input_schema):
                valid = _place(path, "P0001", valid)
            for args in [None, [], "", "[]", "null", "5", "{", 7, ["a"], {"x": {"y": 1}}]:
                seen.add(execute_tool_call(world, h, tool.name, args).status)
            for path in leaf_paths(tool.input_schema):
                for value in ODD_VALUES:
                    ex = execute_tool_call(world, h, tool.name, _place(path, value, valid))
                    assert ex.result.get("error", {}).get("type") != "internal_error", (tool.name, path, value, ex)
                    json.dumps(ex.result, ensure_ascii=False)  # the payload is always JSON
                    seen.add(ex.status)
    assert {"ok", "error", "invalid_arguments"} <= seen


def test_an_oversized_tool_result_becomes_a_clear_error():
    from hat_jax.sim.executor import MAX_RESULT_CHARS, ToolExecution, limit_result_size

    small = ToolExecution("ok", {"a": "x" * 10}, {"q": 1}, "search_products")
    assert limit_result_size(small) is small
    big = ToolExecution("ok", {"a": "好" * 5_000_000}, {"q": 1}, "search_products")
    out = limit_result_size(big)
    assert (out.status, out.canonical_args, out.impl) == ("error", {"q": 1}, "search_products")
    assert out.result == {"error": {"type": "result_too_large",
                                    "message": f"工具结果过大（result too large）：5000009 个字符，上限 {MAX_RESULT_CHARS} 个字符",
                                    "details": {"chars": 5000009, "limit": MAX_RESULT_CHARS}}}
