"""The seeded product catalog of the live-stream world (`World`).

A deterministic catalog drawn from Chinese word pools: every product name is brand-like prefix x
selling-point attribute x item noun (e.g. "云朵法式碎花连衣裙"), unique, and never a substring of
another name, so that a search for the full name always ranks that product first. Each product
carries what the world tools report (`hat_jax.sim.tools`): list and live price (CNY), material (or
ingredients/main component), origin and specs, SKUs (two dimensions: colour x size for apparel and
shoes, flavour x weight for food, ...) with stock (some sold out), a size chart with height/weight
ranges for apparel (foot length for shoes), shipping (ship-from city, dispatch time, fee, 包邮
threshold, regions not served), promotions (满减, 直播间专享价) with coupons, and after-sales rules
(7/15 天无理由, 运费险, warranty months).

SKU ids are "<product id>-<dimension 1>-<dimension 2>", e.g. "P0001-黑色-M" or "P0107-香辣-500g":
readable, so an agent can compose them from the product id and the viewer's words. Dimension values
never contain "-".

The catalog is data only; `hat_jax.sim.tools.call_world_function(world, impl, canonical_args)` runs a
world function over it. `World.to_dict` / `World.from_dict` round-trip it through JSON for
caching.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping
from typing import Any

from hat_jax.sim.catalog_pools import BRANDS, CATEGORIES, DISPATCH_HOURS, ORIGINS, SHIP_FROM, SIZE_CHARTS

MIN_PRODUCTS = len(CATEGORIES)  # `World.generate` needs one product per category at least
MAX_PRODUCTS = 2000  # the name pools' limit


@dataclasses.dataclass
class Sku:
    """One stock-keeping unit: `sku_id` = "<product_id>-<v1>-<v2>"."""

    sku_id: str
    v1: str
    v2: str
    stock: int


@dataclasses.dataclass
class Product:
    """One catalog product (all money in CNY, floats with at most 2 decimals).

    Attributes:
      size_chart: size -> {"height_cm": [lo, hi], "weight_kg": [lo, hi]} (apparel) or
        {"foot_length_mm": n} (shoes); None when the product has no sizes.
      shipping: {"ship_from", "dispatch_hours", "free_shipping_threshold" (0 = always 包邮),
        "base_fee", "remote_fee", "excluded_regions"}.
      promotions: [{"type": "满减"|"直播间专享价", "description", ...}].
      coupons: [{"coupon_id", "name", "amount", "threshold", "valid_until"}].
      after_sales: {"return_days", "free_return_insurance", "warranty_months", "notes"}.
    """

    product_id: str
    name: str
    brand: str
    noun: str
    category: str
    material: str
    origin: str
    specs: dict[str, str]
    list_price: float
    live_price: float
    dims: tuple[str, str]
    skus: tuple[Sku, ...]
    size_chart: dict[str, dict[str, Any]] | None
    shipping: dict[str, Any]
    promotions: list[dict[str, Any]]
    coupons: list[dict[str, Any]]
    after_sales: dict[str, Any]

    @property
    def short_name(self) -> str:
        """Brand + item noun, the short form viewers often write ("云朵连衣裙")."""
        return self.brand + self.noun


def _price(rng: random.Random, lo: int, hi: int) -> tuple[float, float]:
    """(list price, live price): list ends in 9 or 9.9; live is 60-90% of it, ending in .9 or 9."""
    list_price = float(rng.randrange(lo // 10, hi // 10 + 1) * 10 + 9)
    live = list_price * rng.uniform(0.6, 0.9)
    live_price = round(int(live) + 0.9, 2) if rng.random() < 0.5 else float(int(live) // 10 * 10 + 9)
    return list_price, min(live_price, list_price - 10.0)


def _skus(rng: random.Random, pid: str, spec: dict[str, Any]) -> tuple[list[Sku], list[str]]:
    """(the SKUs: every drawn first-dimension value x every drawn second one, with stock; the second values)."""
    v1s = sorted(rng.sample(spec["v1"], rng.randint(2, min(4, len(spec["v1"])))), key=spec["v1"].index)
    n2 = len(spec["v2"])
    start = rng.randrange(0, max(1, n2 - 3))
    v2s = list(spec["v2"][start : start + rng.randint(min(3, n2), min(5, n2))])
    skus = []
    for v1 in v1s:
        for v2 in v2s:
            u = rng.random()
            stock = 0 if u < 0.15 else rng.randint(1, 9) if u < 0.3 else rng.randint(10, 500)
            skus.append(Sku(f"{pid}-{v1}-{v2}", v1, v2, stock))
    return skus, v2s


def _size_chart(spec: dict[str, Any], sizes: list[str]) -> dict[str, dict[str, Any]] | None:
    """The category's size chart restricted to the product's sizes (None for categories without one)."""
    if spec["chart"] == "shoes":
        return {s: {"foot_length_mm": SIZE_CHARTS["shoes"][s]} for s in sizes}
    if spec["chart"]:
        return {
            s: {"height_cm": list(h), "weight_kg": list(w)}
            for s, (h, w) in SIZE_CHARTS[spec["chart"]].items()
            if s in sizes
        }
    return None


def _specs(rng: random.Random, category: str, spec: dict[str, Any], brand: str) -> tuple[str, dict[str, str]]:
    """(origin, the spec table: origin, brand and one category-specific row)."""
    origin = rng.choice(ORIGINS)
    specs = {"产地": origin, "品牌": brand}
    if category == "食品零食":
        specs["保质期"] = f"{rng.choice((6, 9, 12, 18))}个月"
    elif category == "数码配件":
        specs["续航/功率"] = rng.choice(("20W", "30W", "65W", "续航30小时", "续航7天"))
    elif category == "美妆护肤":
        specs["适用肤质"] = rng.choice(("所有肤质", "干性肌肤", "油性肌肤", "敏感肌"))
    elif spec["chart"]:
        specs["版型"] = rng.choice(("宽松", "修身", "常规"))
    return origin, specs


def _shipping(rng: random.Random) -> dict[str, Any]:
    ship_from = rng.choice(sorted(SHIP_FROM))
    threshold = rng.choice((0.0, 0.0, 0.0, 59.0, 99.0, 199.0))
    excluded = ["香港", "澳门", "台湾"] + (["新疆", "西藏"] if rng.random() < 0.25 else [])
    return {
        "ship_from": ship_from,
        "dispatch_hours": rng.choice(DISPATCH_HOURS),
        "free_shipping_threshold": threshold,
        "base_fee": 0.0 if threshold == 0 else rng.choice((6.0, 8.0, 10.0)),
        "remote_fee": rng.choice((10.0, 15.0, 20.0)),
        "excluded_regions": excluded,
    }


def _promotions(rng: random.Random, live_price: float) -> list[dict[str, Any]]:
    """The live-room price, and a 满减 half the time."""
    promotions: list[dict[str, Any]] = [
        {"type": "直播间专享价", "description": f"直播间专享价{live_price:g}元", "price": live_price}
    ]
    if rng.random() < 0.5:
        th = float(rng.choice((199, 299, 399, 599)))
        off = float(rng.choice((20, 30, 40, 50, 60)))
        promotions.append({"type": "满减", "description": f"满{th:g}减{off:g}", "threshold": th, "discount": off})
    return promotions


def _coupons(rng: random.Random, index: int, live_price: float) -> list[dict[str, Any]]:
    coupons = []
    for k in range(rng.choice((0, 1, 1, 2))):
        amount = float(rng.choice((5, 10, 15, 20, 30, 50)))
        cth = float(max(int(amount * 4), int(live_price // 50 * 50) + 50 * k))
        coupons.append(
            {
                "coupon_id": f"C{index:04d}{k + 1}",
                "name": ("店铺券", "主播专享券")[k],
                "amount": amount,
                "threshold": cth,
                "valid_until": rng.choice(("2026-12-31", "2026-11-30", "2027-01-15")),
            }
        )
    return coupons


def _after_sales(rng: random.Random, category: str, noun: str) -> dict[str, Any]:
    """Return days, return insurance, a warranty for electric goods, and the no-return note of food and beauty."""
    digital = category in ("数码配件",) or noun in ("电热毯", "不粘锅", "婴儿推车", "儿童餐椅")
    no_reason = (
        "食品类商品拆封后不支持无理由退货"
        if category == "食品零食"
        else "美妆类商品拆封后不支持无理由退货"
        if category == "美妆护肤"
        else ""
    )
    return {
        "return_days": rng.choice((7, 7, 15)),
        "free_return_insurance": rng.random() < 0.6,
        "warranty_months": rng.choice((6, 12, 24)) if digital else 0,
        "notes": no_reason,
    }


def _product(rng: random.Random, index: int, category: str, name_parts: tuple[str, str, str]) -> Product:
    """Draws one product's attributes (the name is chosen by the caller to keep names unique)."""
    spec = CATEGORIES[category]
    brand, attr, noun = name_parts
    pid = f"P{index:04d}"
    list_price, live_price = _price(rng, *spec["price"])
    skus, sizes = _skus(rng, pid, spec)
    origin, specs = _specs(rng, category, spec, brand)
    shipping = _shipping(rng)
    promotions = _promotions(rng, live_price)
    coupons = _coupons(rng, index, live_price)
    after_sales = _after_sales(rng, category, noun)
    material = rng.choice(spec["materials"])
    return Product(
        pid,
        brand + attr + noun,
        brand,
        noun,
        category,
        material,
        origin,
        specs,
        list_price,
        live_price,
        tuple(spec["dims"]),
        tuple(skus),
        _size_chart(spec, sizes),
        shipping,
        promotions,
        coupons,
        after_sales,
    )


@dataclasses.dataclass
class World:
    """The catalog: products in id order, with indexes by product id and SKU id.

    Build it with `World.generate(seed, n_products)`; it is plain data (no RNG state kept).
    """

    seed: int
    products: tuple[Product, ...]

    def __post_init__(self) -> None:
        self._by_id = {p.product_id: p for p in self.products}
        self._by_sku = {s.sku_id: (p, s) for p in self.products for s in p.skus}

    @classmethod
    def generate(cls, seed: int = 0, n_products: int = 240) -> World:
        """Draws a catalog deterministically from `seed`.

        Args:
          seed: catalog seed (the same seed gives the same catalog, byte for byte).
          n_products: number of products, spread round-robin over the categories (an int in
            [`MIN_PRODUCTS`, `MAX_PRODUCTS`]).
        Raises:
          ValueError: n_products not an int, smaller than the number of categories or larger than the
            name pools allow.
        """
        n = n_products
        if isinstance(n, bool) or not isinstance(n, int) or not MIN_PRODUCTS <= n <= MAX_PRODUCTS:
            raise ValueError(f"n_products must be an int in [{MIN_PRODUCTS}, {MAX_PRODUCTS}], got {n_products!r}")
        rng = random.Random(f"catalog:{seed}")
        cats = list(CATEGORIES)
        names: set[str] = set()
        products = []
        for i in range(n_products):
            category = cats[i % len(cats)]
            spec = CATEGORIES[category]
            for _ in range(1000):
                parts = (rng.choice(BRANDS), rng.choice(spec["attrs"]), rng.choice(spec["nouns"]))
                name = "".join(parts)
                if all(name not in n and n not in name for n in names):
                    break
            else:
                raise ValueError(f"n_products={n_products}: ran out of unique names in category {category!r}")
            names.add(name)
            products.append(_product(rng, i + 1, category, parts))
        return cls(seed, tuple(products))

    @property
    def categories(self) -> tuple[str, ...]:
        """Categories present, in catalog order."""
        return tuple(dict.fromkeys(p.category for p in self.products))

    def product(self, product_id: str) -> Product | None:
        """The product with id `product_id`, or None."""
        return self._by_id.get(product_id)

    def sku(self, sku_id: str) -> tuple[Product, Sku] | None:
        """(product, SKU) for `sku_id`, or None."""
        return self._by_sku.get(sku_id)

    def to_dict(self) -> dict:
        """JSON-serialisable form (`World.from_dict` inverts it)."""
        return {"seed": self.seed, "products": [dataclasses.asdict(p) for p in self.products]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> World:
        """Rebuilds a world from `to_dict` output (JSON round-tripped lists are accepted)."""
        products = []
        for p in data["products"]:
            fields = dict(p)
            fields["skus"] = tuple(Sku(**s) for s in p["skus"])
            fields["dims"] = tuple(p["dims"])
            products.append(Product(**fields))
        return cls(int(data["seed"]), tuple(products))
