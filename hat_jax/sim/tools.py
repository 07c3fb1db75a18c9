"""The world's tool functions: pure functions over the catalog, each declared once with `@world_tool`.

Each function takes the `World` and canonical keyword arguments (product_id, sku_id, query,
category, max_results, region, height_cm, weight_kg) and returns a JSON-serialisable dict with
English keys and Chinese values. A business error the model should see (unknown product or SKU,
region not served, a product without a size chart) raises `ToolError`, and so does an argument that
passes the schema but not the function's own check (a blank search query: kind "invalid_arguments"
with details.errors naming the argument); the executor turns every `ToolError` into a structured
error result. Nothing here depends on a harness: harness tools bind to these functions by
`Tool.impl` and map their surface arguments to the canonical names with `Tool.arg_paths`.

`@world_tool(arg=JSON Schema, ...)` registers a function in `WORLD_FUNCTIONS`: its name is the impl a
harness tool binds to, its signature says which arguments are required, and the canonical JSON Schema of
its arguments (`CANONICAL_SCHEMAS`, what the production harness's tools start from), `TOOL_IMPLS` and what
a harness may bind to (`hat_jax.sim.world_harness.WORLD_BINDINGS`) all derive from it, so a tool's arguments
are declared only here. `WORLD_FUNCTIONS[impl]` is a `WorldFunction`, callable as `fn(world, **canonical_args)`.
Tools bound to "distractor:<name>" are served by `distractor_result`, a plausible answer that no
task needs (live-room heat, weather, courier list, ...).

Search (`search_products`) ranks products by: the query is a substring of the name (+100), plus the
number of distinct character bigrams of the query found in the product name or category; ties by
product id. A product's full name therefore always ranks first for itself (names are never
substrings of one another), and "brand + item noun" short forms usually do (the task generator
checks).
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import jsonschema

from hat_jax.harness.state import DISTRACTOR_PREFIX
from hat_jax.sim.catalog import World

# Provinces by shipping zone; a few cities resolve to their province.
ZONES: dict[str, tuple[str, ...]] = {
    "华东": ("上海", "江苏", "浙江", "安徽", "福建", "江西", "山东"),
    "华南": ("广东", "广西", "海南"),
    "华北": ("北京", "天津", "河北", "山西", "内蒙古"),
    "华中": ("河南", "湖北", "湖南"),
    "西南": ("重庆", "四川", "贵州", "云南", "西藏"),
    "西北": ("陕西", "甘肃", "青海", "宁夏", "新疆"),
    "东北": ("辽宁", "吉林", "黑龙江"),
    "港澳台": ("香港", "澳门", "台湾"),
}
PROVINCE_ZONE = {p: z for z, ps in ZONES.items() for p in ps}
REMOTE = ("新疆", "西藏", "青海", "内蒙古")
CITIES = {
    "杭州": "浙江", "宁波": "浙江", "义乌": "浙江", "温州": "浙江", "广州": "广东", "深圳": "广东", "东莞": "广东", "佛山": "广东", "南京": "江苏",
    "苏州": "江苏", "无锡": "江苏", "成都": "四川", "武汉": "湖北", "长沙": "湖南", "郑州": "河南", "西安": "陕西", "青岛": "山东", "济南": "山东",
    "厦门": "福建", "泉州": "福建", "福州": "福建", "合肥": "安徽", "南昌": "江西", "沈阳": "辽宁", "大连": "辽宁", "长春": "吉林",
    "哈尔滨": "黑龙江", "昆明": "云南", "贵阳": "贵州", "南宁": "广西", "海口": "海南", "三亚": "海南", "石家庄": "河北", "太原": "山西",
    "兰州": "甘肃", "西宁": "青海", "银川": "宁夏", "乌鲁木齐": "新疆", "拉萨": "西藏", "呼和浩特": "内蒙古"
}
_REGION_SUFFIXES = ("维吾尔自治区", "壮族自治区", "回族自治区", "特别行政区", "自治区", "省", "市")


class ToolError(Exception):
    """A business error a tool reports to the model (not a crash).

    Attributes:
      message: Chinese message naming the bad value.
      kind: error type for the structured result ("not_found", "not_served", "no_size_chart",
        "invalid_arguments").
      details: extra JSON-serialisable data (e.g. the valid SKU ids). For kind "invalid_arguments"
        it always holds "errors": [{"path": canonical argument name or "(root)", "message"}]; when
        the raiser gives none, one entry {"path": "(root)", "message": message} is filled in, so
        every invalid-arguments error has the shape the executor reports (use `ToolError.invalid`).
    """

    def __init__(self, message: str, kind: str = "not_found", details: Mapping[str, Any] | None = None):
        super().__init__(message)
        self.message = str(message)
        self.kind = str(kind)
        self.details = dict(details or {})
        if self.kind == "invalid_arguments":
            errors = self.details.get("errors")
            if not isinstance(errors, list) or not errors:
                errors = [{"path": "(root)", "message": self.message}]
            self.details["errors"] = [
                {"path": str(e.get("path", "(root)")), "message": str(e.get("message", self.message))}
                if isinstance(e, Mapping)
                else {"path": "(root)", "message": str(e)}
                for e in errors
            ]

    @classmethod
    def invalid(cls, path: str, message: str) -> ToolError:
        """An "invalid_arguments" error about canonical argument `path` (details.errors has one entry)."""
        return cls(message, kind="invalid_arguments", details={"errors": [{"path": path, "message": message}]})


@dataclasses.dataclass(frozen=True)
class WorldFunction:
    """A world tool function with its canonical argument schema; call it as `fn(world, **args)`."""

    impl: str
    fn: Callable[..., dict]
    input_schema: Mapping[str, Any]
    description: str

    def __call__(self, world: World, **canonical_args: Any) -> dict:
        return self.fn(world, **canonical_args)


WORLD_FUNCTIONS: dict[str, WorldFunction] = {}


def world_tool(**arguments: Mapping[str, Any]):
    """Declares the decorated function a world tool, registered in `WORLD_FUNCTIONS` under its name.

    Args:
      arguments: canonical argument name -> its JSON Schema (type, description, bounds), one for each
        parameter of the function after `world`; a parameter without a default is a required argument.
    The tool's input schema is {"type": "object", "properties": (in the signature's order), "required": [...],
    "additionalProperties": False}, its description the docstring's first line.

    Raises:
      ValueError (at import, naming the function and the argument): a name already registered, a parameter
        without a schema or a schema without a parameter, a schema without "type", no docstring.
    """

    def register(fn: Callable[..., dict]) -> Callable[..., dict]:
        name = fn.__name__
        params = list(inspect.signature(fn).parameters.values())
        if name in WORLD_FUNCTIONS:
            raise ValueError(f"world tool {name!r}: already registered")
        if not params or params[0].name != "world":
            raise ValueError(f"world tool {name!r}: expected `world` as its first parameter")
        names = [p.name for p in params[1:]]
        for arg in names:
            if arg not in arguments:
                raise ValueError(f"world tool {name!r}: argument {arg!r} has no schema in @world_tool(...)")
        for arg, schema in arguments.items():
            if arg not in names:
                raise ValueError(f"world tool {name!r}: @world_tool names {arg!r}, which is not a parameter")
            if not isinstance(schema, Mapping) or "type" not in schema:
                raise ValueError(f"world tool {name!r}: the schema of {arg!r} needs a 'type'")
        if not (fn.__doc__ or "").strip():
            raise ValueError(f"world tool {name!r}: needs a docstring (its first line is the tool's description)")
        schema = {
            "type": "object",
            "properties": {arg: dict(arguments[arg]) for arg in names},
            "required": [p.name for p in params[1:] if p.default is p.empty],
            "additionalProperties": False,
        }
        WORLD_FUNCTIONS[name] = WorldFunction(name, fn, schema, fn.__doc__.strip().splitlines()[0])
        return fn

    return register


_PID = {"type": "string", "description": "商品ID，如 P0001"}


def _product(world: World, product_id: str):
    product = world.product(product_id)
    if product is None:
        raise ToolError(
            f"商品不存在（product_id={product_id!r}），请先用商品搜索获取正确的商品ID",
            details={"product_id": product_id},
        )
    return product


def resolve_region(region: str) -> str:
    """Province-level name for a province, municipality or major city ("广东省", "深圳市" -> "广东").

    Raises:
      ToolError: the region is not recognised (kind "not_found").
    """
    name = region.strip()
    for suffix in _REGION_SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
            break
    if name in PROVINCE_ZONE:
        return name
    if name in CITIES:
        return CITIES[name]
    raise ToolError(f"无法识别的地区（region={region!r}），请提供省份或城市名", details={"region": region})


@world_tool(
    query={"type": "string", "description": "搜索关键词，如商品名"},
    category={"type": "string", "description": "类目，如 女装"},
    max_results={"type": "integer", "minimum": 1, "maximum": 20, "description": "最多返回几条"},
)
def search_products(world: World, query: str, category: str | None = None, max_results: int = 5) -> dict:
    """Products matching `query` (see the module docstring for the ranking), best first."""
    q = "".join(query.split()).lower()
    if not q:
        raise ToolError.invalid("query", "搜索关键词不能为空（query）")
    if category is not None and category not in world.categories:
        raise ToolError(f"没有这个类目（category={category!r}）", details={"valid_categories": list(world.categories)})
    grams = {q[i : i + 2] for i in range(len(q) - 1)} or {q}
    scored = []
    for p in world.products:
        if category is not None and p.category != category:
            continue
        text = (p.name + p.category).lower()
        score = (100 if q in p.name.lower() else 0) + sum(g in text for g in grams)
        if score > 0:
            scored.append((-score, p.product_id, p))
    scored.sort(key=lambda t: t[:2])
    hits = [
        {"product_id": p.product_id, "name": p.name, "category": p.category, "brand": p.brand}
        for _, _, p in scored[:max_results]
    ]
    return {"query": query, "total": len(scored), "products": hits}


@world_tool(product_id=_PID)
def get_product_detail(world: World, product_id: str) -> dict:
    """Name, category, material, origin, specs, SKU dimensions and SKU ids of a product."""
    p = _product(world, product_id)
    d1, d2 = p.dims
    material_label = {"食品零食": "配料", "美妆护肤": "主要成分"}.get(p.category, "材质")
    return {
        "product_id": p.product_id,
        "name": p.name,
        "category": p.category,
        "brand": p.brand,
        "material": p.material,
        "material_label": material_label,
        "origin": p.origin,
        "specs": dict(p.specs),
        "sku_dimensions": {
            d1: list(dict.fromkeys(s.v1 for s in p.skus)),
            d2: list(dict.fromkeys(s.v2 for s in p.skus)),
        },
        "sku_ids": [s.sku_id for s in p.skus],
        "sku_id_format": "商品ID-" + d1 + "-" + d2,
    }


@world_tool(product_id=_PID)
def get_price(world: World, product_id: str) -> dict:
    """List price and live-room price (CNY)."""
    p = _product(world, product_id)
    return {
        "product_id": p.product_id,
        "name": p.name,
        "list_price": p.list_price,
        "live_price": p.live_price,
        "currency": "CNY",
        "price_note": "直播间专享价，以下单页为准",
    }


@world_tool(sku_id={"type": "string", "description": "SKU ID，格式 商品ID-规格1-规格2，如 P0001-黑色-M"})
def get_stock(world: World, sku_id: str) -> dict:
    """Stock of one SKU ("<product id>-<v1>-<v2>")."""
    found = world.sku(sku_id)
    if found is None:
        product = world.product(sku_id.split("-")[0])
        if product is None:
            raise ToolError(
                f"SKU不存在（sku_id={sku_id!r}），格式为 商品ID-规格1-规格2，如 P0001-黑色-M",
                details={"sku_id": sku_id},
            )
        raise ToolError(
            f"该商品没有这个规格（sku_id={sku_id!r}）",
            details={"sku_id": sku_id, "valid_sku_ids": [s.sku_id for s in product.skus]},
        )
    p, s = found
    status = "已售罄" if s.stock == 0 else "库存紧张" if s.stock < 10 else "有货"
    return {
        "sku_id": s.sku_id,
        "product_id": p.product_id,
        "name": p.name,
        "spec": {p.dims[0]: s.v1, p.dims[1]: s.v2},
        "stock": s.stock,
        "in_stock": s.stock > 0,
        "status": status,
    }


@world_tool(product_id=_PID)
def get_promotions(world: World, product_id: str) -> dict:
    """Promotions (满减, 直播间专享价) and coupons of a product."""
    p = _product(world, product_id)
    return {
        "product_id": p.product_id,
        "name": p.name,
        "promotions": [dict(x) for x in p.promotions],
        "coupons": [dict(c) for c in p.coupons],
    }


def shipping_days(ship_from_province: str, province: str, dispatch_hours: int) -> tuple[int, int]:
    """(min, max) delivery days: same province 1-2, same zone 2-3, other zone 3-5, remote 5-8, +1 for 72 h dispatch."""
    if province in REMOTE:
        lo, hi = 5, 8
    elif province == ship_from_province:
        lo, hi = 1, 2
    elif PROVINCE_ZONE[province] == PROVINCE_ZONE[ship_from_province]:
        lo, hi = 2, 3
    else:
        lo, hi = 3, 5
    extra = 1 if dispatch_hours >= 72 else 0
    return lo + extra, hi + extra


@world_tool(product_id=_PID, region={"type": "string", "description": "收货省份或城市，如 广东"})
def estimate_shipping(world: World, product_id: str, region: str) -> dict:
    """Delivery days and fee of one item of the product to `region` (province or city)."""
    from hat_jax.sim.catalog_pools import SHIP_FROM

    p = _product(world, product_id)
    province = resolve_region(region)
    ship = p.shipping
    if province in ship["excluded_regions"]:
        raise ToolError(
            f"该商品暂不支持配送至{province}（region={region!r}）",
            kind="not_served",
            details={"region": province, "excluded_regions": list(ship["excluded_regions"])},
        )
    lo, hi = shipping_days(SHIP_FROM[ship["ship_from"]], province, ship["dispatch_hours"])
    threshold = ship["free_shipping_threshold"]
    if province in REMOTE:
        fee, note = ship["remote_fee"], "偏远地区不包邮"
    elif threshold == 0 or p.live_price >= threshold:
        fee, note = 0.0, "包邮"
    else:
        fee, note = ship["base_fee"], f"满{threshold:g}元包邮"
    return {
        "product_id": p.product_id,
        "name": p.name,
        "ship_from": ship["ship_from"],
        "region": province,
        "dispatch": f"付款后{ship['dispatch_hours']}小时内发货",
        "days_min": lo,
        "days_max": hi,
        "fee": fee,
        "free_shipping": fee == 0.0,
        "note": note,
    }


def recommend_size(
    chart: Mapping[str, Mapping[str, Any]], height_cm: int | None, weight_kg: int | None
) -> tuple[str | None, str]:
    """(size, note): the smallest size whose height and weight upper bounds cover the viewer's.

    Sizes are taken in chart order; with only one of height/weight given, only that one counts.
    Above the largest size: the largest size and a note; with neither given: (None, note).
    """
    if height_cm is None and weight_kg is None:
        return None, "提供身高体重可推荐尺码"
    for size, row in chart.items():
        if (height_cm is None or height_cm <= row["height_cm"][1]) and (
            weight_kg is None or weight_kg <= row["weight_kg"][1]
        ):
            return size, "按身高体重推荐"
    return list(chart)[-1], "超出尺码表范围，已推荐最大码，建议联系客服确认"


@world_tool(
    product_id=_PID,
    height_cm={"type": "integer", "minimum": 40, "maximum": 230, "description": "身高（厘米）"},
    weight_kg={"type": "integer", "minimum": 5, "maximum": 200, "description": "体重（公斤）"},
)
def get_size_chart(world: World, product_id: str, height_cm: int | None = None, weight_kg: int | None = None) -> dict:
    """Size chart rows and, for apparel with height/weight given, the recommended size."""
    p = _product(world, product_id)
    if p.size_chart is None:
        raise ToolError(
            f"该商品没有尺码表（product_id={product_id!r}，类目：{p.category}）",
            kind="no_size_chart",
            details={"product_id": product_id, "category": p.category},
        )
    first = next(iter(p.size_chart.values()))
    if "foot_length_mm" in first:
        rows = [{"size": s, "foot_length_mm": r["foot_length_mm"]} for s, r in p.size_chart.items()]
        return {
            "product_id": p.product_id,
            "name": p.name,
            "size_chart": rows,
            "recommended_size": None,
            "note": "鞋码请按脚长选择",
        }
    rows = [
        {"size": s, "height_cm": "{}-{}".format(*r["height_cm"]), "weight_kg": "{}-{}".format(*r["weight_kg"])}
        for s, r in p.size_chart.items()
    ]
    size, note = recommend_size(p.size_chart, height_cm, weight_kg)
    return {"product_id": p.product_id, "name": p.name, "size_chart": rows, "recommended_size": size, "note": note}


@world_tool(product_id=_PID)
def get_after_sales_policy(world: World, product_id: str) -> dict:
    """Return window, 运费险, warranty and notes."""
    p = _product(world, product_id)
    a = p.after_sales
    return {
        "product_id": p.product_id,
        "name": p.name,
        "return_days": a["return_days"],
        "return_policy": f"支持{a['return_days']}天无理由退货" + (f"（{a['notes']}）" if a["notes"] else ""),
        "free_return_insurance": a["free_return_insurance"],
        "return_insurance": "赠送运费险" if a["free_return_insurance"] else "无运费险",
        "warranty_months": a["warranty_months"],
        "warranty": f"质保{a['warranty_months']}个月" if a["warranty_months"] else "无质保",
    }


CANONICAL_SCHEMAS: dict[str, dict] = {impl: dict(f.input_schema) for impl, f in WORLD_FUNCTIONS.items()}
TOOL_IMPLS: tuple[str, ...] = tuple(WORLD_FUNCTIONS)
_VALIDATORS = {k: jsonschema.Draft202012Validator(v) for k, v in CANONICAL_SCHEMAS.items()}

_DISTRACTOR_PAYLOADS = (
    lambda h: {"live_room": "直播间热度", "online_viewers": 1000 + h % 50000, "likes": 20000 + h % 900000},
    lambda h: {
        "weather": ("晴", "多云", "小雨", "阴")[h % 4],
        "temperature_c": 5 + h % 25,
        "city": ("杭州", "北京", "广州")[h % 3],
    },
    lambda h: {
        "couriers": ["中通快递", "圆通速递", "顺丰速运", "韵达快递"][: 2 + h % 3],
        "note": "快递公司以实际发货为准",
    },
    lambda h: {
        "host_schedule": [{"time": f"{18 + h % 4}:00", "host": ("小美", "阿杰", "朵朵")[h % 3]}],
        "note": "主播排班表",
    },
    lambda h: {"fan_level": ("铁粉", "钻粉", "挚爱粉")[h % 3], "points": h % 5000, "note": "粉丝等级与积分"},
)


def distractor_result(impl: str) -> dict:
    """A plausible result no task needs, deterministic in the distractor's name (`impl` = "distractor:<name>")."""
    name = impl[len(DISTRACTOR_PREFIX) :] if impl.startswith(DISTRACTOR_PREFIX) else impl
    h = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big")
    return {"tool": name, **_DISTRACTOR_PAYLOADS[h % len(_DISTRACTOR_PAYLOADS)](h)}


def _coerce_integers(impl: str, args: Mapping[str, Any]) -> dict:
    """`args` with integral floats (5.0) turned into ints where the canonical schema says "integer".

    JSON Schema counts 5.0 as an integer, and JSON text cannot tell 5 from 5.0 reliably, so a value
    that passed validation may still be a float; the world functions take Python ints.
    """
    props = CANONICAL_SCHEMAS[impl]["properties"]
    return {
        k: int(v) if isinstance(v, float) and props.get(k, {}).get("type") == "integer" and v.is_integer() else v
        for k, v in args.items()
    }


def call_world_function(world: World, impl: str, canonical_args: Mapping[str, Any]) -> dict:
    """Runs world function `impl` (or a distractor) with canonical arguments checked against its schema.

    Arguments that pass the schema are passed on with integral floats of "integer" properties made
    ints (`_coerce_integers`).

    Raises:
      ToolError: a business error, or arguments that fail the canonical schema (kind "invalid_arguments",
        details {"errors": [{"path", "message"}]}).
      KeyError: `impl` is neither a world function nor a distractor.
    """
    if impl.startswith(DISTRACTOR_PREFIX):
        return distractor_result(impl)
    if impl not in WORLD_FUNCTIONS:
        raise KeyError(f"unknown world function {impl!r}; known: {sorted(WORLD_FUNCTIONS)}")
    errors = sorted(_VALIDATORS[impl].iter_errors(dict(canonical_args)), key=lambda e: list(e.absolute_path))
    if errors:
        listed = [{"path": ".".join(map(str, e.absolute_path)) or "(root)", "message": e.message} for e in errors]
        raise ToolError(
            "参数不合法（invalid arguments）: " + "; ".join(f"{x['path']}: {x['message']}" for x in listed),
            kind="invalid_arguments",
            details={"errors": listed},
        )
    return WORLD_FUNCTIONS[impl](world, **_coerce_integers(impl, canonical_args))
