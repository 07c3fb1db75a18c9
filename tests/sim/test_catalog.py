"""The seeded catalog: size, determinism, names, SKUs, size charts, serialisation."""

import json
import re

import pytest

from hat_jax.sim.catalog import World
from hat_jax.sim.catalog_pools import CATEGORIES


def test_counts_and_categories(world):
    assert len(world.products) == 240
    assert len(world.categories) == 10 >= 8
    assert {"女装", "男装", "童装", "鞋靴", "美妆护肤", "食品零食", "家居日用", "数码配件"} <= set(world.categories)
    assert [p.product_id for p in world.products[:3]] == ["P0001", "P0002", "P0003"]
    per_category = {c: sum(p.category == c for p in world.products) for c in world.categories}
    assert set(per_category.values()) == {24}


def test_deterministic_per_seed(world):
    assert World.generate(seed=0).to_dict() == world.to_dict()
    assert World.generate(seed=1).to_dict() != world.to_dict()


def test_pinned_first_product(world):
    # regression pin of seed 0 (catalog drawn from random.Random("catalog:0"))
    p = world.product("P0001")
    assert (p.name, p.category, p.list_price, p.live_price) == ("南风简约通勤针织开衫", "女装", 289.0, 188.9)
    assert p.short_name == "南风针织开衫"


def test_names_unique_chinese_and_never_nested(world):
    names = [p.name for p in world.products]
    assert len(set(names)) == len(names)
    assert all(re.search(r"[\u4e00-\u9fff]{4,}", n) for n in names)
    for a in names:
        assert sum(a in b for b in names) == 1, a  # only itself contains it


def test_prices_skus_and_stock(world):
    for p in world.products:
        assert 0 < p.live_price < p.list_price
        assert round(p.live_price, 2) == p.live_price
        assert len(p.skus) >= 4
        for s in p.skus:
            assert s.sku_id == f"{p.product_id}-{s.v1}-{s.v2}" and "-" not in s.v1 + s.v2
            assert world.sku(s.sku_id) == (p, s)
    stocks = [s.stock for p in world.products for s in p.skus]
    assert 0 in stocks and max(stocks) > 100
    assert 0.05 < sum(s == 0 for s in stocks) / len(stocks) < 0.3


def test_size_charts_only_for_apparel_and_shoes(world):
    for p in world.products:
        kind = CATEGORIES[p.category]["chart"]
        assert (p.size_chart is None) == (kind is None)
        if p.size_chart:
            assert list(p.size_chart) == list(dict.fromkeys(s.v2 for s in p.skus))
    dress = next(p for p in world.products if p.category == "女装" and "M" in p.size_chart)
    assert dress.size_chart["M"] == {"height_cm": [158, 164], "weight_kg": [47, 54]}
    shoe = next(p for p in world.products if p.category == "鞋靴")
    assert all(set(r) == {"foot_length_mm"} for r in shoe.size_chart.values())


def test_promotions_coupons_after_sales(world):
    assert all(
        p.promotions[0]["type"] == "直播间专享价" and p.promotions[0]["price"] == p.live_price for p in world.products
    )
    assert any(x["type"] == "满减" for p in world.products for x in p.promotions)
    assert sum(bool(p.coupons) for p in world.products) > 100
    assert {p.after_sales["return_days"] for p in world.products} == {7, 15}
    assert all(p.after_sales["warranty_months"] > 0 for p in world.products if p.category == "数码配件")


def test_json_round_trip(world):
    restored = World.from_dict(json.loads(json.dumps(world.to_dict(), ensure_ascii=False)))
    assert restored.to_dict() == world.to_dict()
    assert restored.product("P0100") == world.product("P0100")


def test_bad_size():
    with pytest.raises(ValueError, match="n_products"):
        World.generate(n_products=3)
