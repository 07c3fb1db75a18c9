"""World tool functions: search ranking, business errors, hand-checked shipping and size rules."""

import json

import jsonschema
import pytest

from hat_jax.sim import tools as T
from hat_jax.sim.tools import (
    CANONICAL_SCHEMAS,
    TOOL_IMPLS,
    WORLD_FUNCTIONS,
    ToolError,
    call_world_function,
    distractor_result,
    recommend_size,
    resolve_region,
    shipping_days,
)
from hat_jax.sim.world_harness import WORLD_BINDINGS

CANONICAL = {"product_id", "sku_id", "query", "category", "max_results", "region", "height_cm", "weight_kg"}


def test_registry_declares_each_tool_once():
    assert TOOL_IMPLS == tuple(WORLD_FUNCTIONS) == ("search_products", "get_product_detail", "get_price", "get_stock",
                                                    "get_promotions", "estimate_shipping", "get_size_chart",
                                                    "get_after_sales_policy")
    for impl, fn in WORLD_FUNCTIONS.items():
        jsonschema.Draft202012Validator.check_schema(fn.input_schema)
        assert set(fn.input_schema["properties"]) <= CANONICAL, impl
        assert CANONICAL_SCHEMAS[impl] == fn.input_schema and fn.input_schema["additionalProperties"] is False
    assert CANONICAL_SCHEMAS["search_products"]["required"] == ["query"]
    assert list(CANONICAL_SCHEMAS["get_size_chart"]["properties"]) == ["product_id", "height_cm", "weight_kg"]
    assert WORLD_FUNCTIONS["get_price"].description == "List price and live-room price (CNY)."
    # what a harness may bind to derives from the same declarations
    assert WORLD_BINDINGS.tool_args["search_products"] == (("query",), ("category", "max_results"))
    assert WORLD_BINDINGS.tool_args["estimate_shipping"] == (("product_id", "region"), ())
    assert WORLD_BINDINGS.tool_args["get_size_chart"] == (("product_id",), ("height_cm", "weight_kg"))
    assert set(WORLD_BINDINGS.tool_args) == set(TOOL_IMPLS)


def test_an_incomplete_world_tool_declaration_fails_naming_the_tool_and_the_argument():
    def toy_tool(world, product_id: str, colour: str = "黑色") -> dict:
        """A toy tool."""
        return {}

    def undocumented(world, product_id: str) -> dict:
        return {}

    def no_world(product_id: str) -> dict:
        """No world."""
        return {}

    pid = {"type": "string"}
    cases = [(toy_tool, {"product_id": pid}, "world tool 'toy_tool': argument 'colour' has no schema"),
             (toy_tool, {"product_id": pid, "colour": pid, "size": pid},
              "world tool 'toy_tool': @world_tool names 'size', which is not a parameter"),
             (toy_tool, {"product_id": pid, "colour": {"description": "颜色"}},
              "world tool 'toy_tool': the schema of 'colour' needs a 'type'"),
             (undocumented, {"product_id": pid}, "world tool 'undocumented': needs a docstring"),
             (no_world, {"product_id": pid}, "world tool 'no_world': expected `world` as its first parameter"),
             (T.get_price, {"product_id": pid}, "world tool 'get_price': already registered")]
    for fn, arguments, message in cases:
        with pytest.raises(ValueError, match=message):
            T.world_tool(**arguments)(fn)
    assert set(WORLD_FUNCTIONS) == set(TOOL_IMPLS)


def test_search_full_name_ranks_first(world):
    for p in world.products:
        hits = call_world_function(world, "search_products", {"query": p.name})["products"]
        assert hits[0]["product_id"] == p.product_id


def test_search_short_form_category_and_limits(world):
    hits = call_world_function(world, "search_products", {"query": "南风针织开衫"})["products"]
    assert hits[0] == {"product_id": "P0001", "name": "南风简约通勤针织开衫", "category": "女装", "brand": "南风"}
    assert len(call_world_function(world, "search_products", {"query": "连衣裙", "max_results": 2})["products"]) == 2
    only = call_world_function(world, "search_products",
                               {"query": "南风", "category": "鞋靴", "max_results": 20})["products"]
    assert only and all(h["category"] == "鞋靴" and h["brand"] == "南风" for h in only)
    assert call_world_function(world, "search_products", {"query": "火箭发动机"})["products"] == []
    with pytest.raises(ToolError, match="category"):
        call_world_function(world, "search_products", {"query": "裙", "category": "汽车"})


def test_price_and_unknown_product(world):
    assert call_world_function(world, "get_price", {"product_id": "P0001"})["live_price"] == 188.9
    with pytest.raises(ToolError, match="P9999") as err:
        call_world_function(world, "get_price", {"product_id": "P9999"})
    assert err.value.kind == "not_found"


def test_stock(world):
    res = call_world_function(world, "get_stock", {"sku_id": "P0001-黑色-M"})
    assert res["spec"] == {"颜色": "黑色", "尺码": "M"} and res["stock"] == 218 and res["in_stock"] is True
    with pytest.raises(ToolError) as err:
        call_world_function(world, "get_stock", {"sku_id": "P0001-紫色-M"})
    assert "P0001-黑色-M" in err.value.details["valid_sku_ids"]
    with pytest.raises(ToolError, match="格式"):
        call_world_function(world, "get_stock", {"sku_id": "黑色M"})


def test_region_resolution():
    assert [resolve_region(r) for r in ("广东", "广东省", "深圳", "深圳市", "新疆维吾尔自治区", "上海市")] == [
        "广东",
        "广东",
        "广东",
        "广东",
        "新疆",
        "上海",
    ]
    with pytest.raises(ToolError, match="火星"):
        resolve_region("火星")


def test_shipping_days_hand_checked():
    assert shipping_days("浙江", "浙江", 24) == (1, 2)
    assert shipping_days("浙江", "江苏", 48) == (2, 3)
    assert shipping_days("浙江", "广东", 24) == (3, 5)
    assert shipping_days("浙江", "新疆", 24) == (5, 8)
    assert shipping_days("浙江", "浙江", 72) == (2, 3)


def test_estimate_shipping(world):
    # P0001 ships from 青岛 (山东, 华东) within 72 h, always 包邮: 广东 is another zone -> 3-5 +1
    res = call_world_function(world, "estimate_shipping", {"product_id": "P0001", "region": "深圳"})
    assert (res["region"], res["days_min"], res["days_max"], res["fee"], res["note"]) == ("广东", 4, 6, 0.0, "包邮")
    remote = call_world_function(world, "estimate_shipping", {"product_id": "P0001", "region": "西藏"})
    assert remote["fee"] == 20.0 and remote["note"] == "偏远地区不包邮"
    with pytest.raises(ToolError) as err:
        call_world_function(world, "estimate_shipping", {"product_id": "P0001", "region": "香港"})
    assert err.value.kind == "not_served"
    excl = next(p for p in world.products if "新疆" in p.shipping["excluded_regions"])
    with pytest.raises(ToolError, match="新疆"):
        call_world_function(world, "estimate_shipping", {"product_id": excl.product_id, "region": "乌鲁木齐"})


def test_recommend_size_hand_checked():
    chart = {
        "S": {"height_cm": [150, 158], "weight_kg": [40, 47]},
        "M": {"height_cm": [158, 164], "weight_kg": [47, 54]},
    }
    assert recommend_size(chart, 155, 45)[0] == "S"
    assert recommend_size(chart, 160, 45)[0] == "M"  # height decides
    assert recommend_size(chart, 155, 50)[0] == "M"  # weight decides
    assert recommend_size(chart, 158, None)[0] == "S"
    size, note = recommend_size(chart, 190, 90)
    assert size == "M" and "超出" in note
    assert recommend_size(chart, None, None)[0] is None


def test_size_chart(world):
    res = call_world_function(world, "get_size_chart", {"product_id": "P0001", "height_cm": 160, "weight_kg": 50})
    assert res["recommended_size"] == "M"
    assert res["size_chart"][0] == {"size": "S", "height_cm": "150-158", "weight_kg": "40-47"}
    shoe = next(p for p in world.products if p.category == "鞋靴")
    assert call_world_function(world, "get_size_chart", {"product_id": shoe.product_id})["recommended_size"] is None
    food = next(p for p in world.products if p.category == "食品零食")
    with pytest.raises(ToolError) as err:
        call_world_function(world, "get_size_chart", {"product_id": food.product_id})
    assert err.value.kind == "no_size_chart"


def test_detail_promotions_after_sales(world):
    detail = call_world_function(world, "get_product_detail", {"product_id": "P0001"})
    assert detail["material"] == "醋酸" and detail["sku_dimensions"]["尺码"] == ["S", "M", "L"]
    assert "P0001-黑色-M" in detail["sku_ids"]
    promo = call_world_function(world, "get_promotions", {"product_id": "P0001"})
    assert promo["promotions"][1]["description"] == "满199减20" and promo["coupons"][0]["amount"] == 50.0
    policy = call_world_function(world, "get_after_sales_policy", {"product_id": "P0008"})
    assert (policy["return_days"], policy["warranty_months"], policy["return_insurance"]) == (15, 12, "无运费险")


def test_results_are_json(world):
    for p in world.products[:30]:
        for impl in ("get_product_detail", "get_price", "get_promotions", "get_after_sales_policy"):
            json.dumps(call_world_function(world, impl, {"product_id": p.product_id}), ensure_ascii=False)


def test_canonical_validation_and_distractor(world):
    with pytest.raises(ToolError) as err:
        call_world_function(world, "get_price", {"product_id": 7})
    assert err.value.kind == "invalid_arguments" and err.value.details["errors"][0]["path"] == "product_id"
    with pytest.raises(KeyError, match="nope"):
        call_world_function(world, "nope", {})
    a = call_world_function(world, "distractor:check_weather", {"x": 1})
    assert a == distractor_result("distractor:check_weather") and a["tool"] == "check_weather"
