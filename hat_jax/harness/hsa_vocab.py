"""HSA's surface vocabulary: word pieces, naming styles, held-out families, paraphrase tables.

Variant implemented and why: at tiny scale, reading a harness is associative recall (bind the intent
to the name written next to it in the prompt and copy that name), and a tiny model never produces a
name built from tokens whose embeddings it never trained (docs/tuning.md, "HSA-SFT"), so every name here
is a combination of word pieces from fixed pools (English and pinyin), written in one of several naming
styles. The held-out families for Harness-Variant QA are new *combinations and styles* of those same
pieces:
- naming styles `HELDOUT_TOOL_STYLES` (dotted.namespace, PascalCase) are never sampled for HSA-SFT or RL (the
  tiny base's generic reading exercises, `hat_jax.data.reading`, write names in every style, and their "arguments"
  kind argument keys in `HELDOUT_ARG_STYLES` too, as a real base has read);
  training uses `TRAIN_TOOL_STYLES` (snake_case, camelCase, kebab-case). Their pieces (incl. the
  `live`/`shop` namespaces, which training uses as prefixes) all occur in training names;
- a fixed fifth of the (verb, noun) combinations (`reserved_combo`, a stable CRC32 rule) is held out;
  training draws only the other combinations, held-out draws only reserved ones;
- prompt layouts: the "bracket" heading style and a persona-last (reversed) section order are held out.
Descriptions, titles and paraphrases are Chinese, from the synonym groups below.
"""

from __future__ import annotations

import functools
import random
import re
import zlib
from collections.abc import Sequence

TRAIN_TOOL_STYLES: tuple[str, ...] = ("snake", "camel", "kebab")
HELDOUT_TOOL_STYLES: tuple[str, ...] = ("dotted", "pascal")
TRAIN_ARG_STYLES: tuple[str, ...] = ("snake", "camel")
HELDOUT_ARG_STYLES: tuple[str, ...] = ("pascal",)
TRAIN_HEADING_STYLES: tuple[str, ...] = ("markdown", "xml", "plain")
HELDOUT_HEADING_STYLES: tuple[str, ...] = ("bracket",)

PREFIXES: tuple[str, ...] = ("live", "shop", "zb", "tb", "tool")  # prefixes (train), namespaces (dotted)
VERBS: tuple[str, ...] = ("get", "fetch", "query", "lookup", "check", "read", "find", "cha", "huoqu", "chaxun")
# World function -> noun variants (each a tuple of pieces). Verbs come from VERBS (search/estimate/load
# have their own verbs as well).
TOOL_NOUNS: dict[str, tuple[tuple[str, ...], ...]] = {
    "search_products": (("products",), ("items",), ("goods",), ("shangpin",), ("baobei",)),
    "get_product_detail": (
        ("product", "detail"),
        ("item", "info"),
        ("goods", "detail"),
        ("shangpin", "xiangqing"),
        ("product", "info"),
    ),
    "get_price": (("price",), ("jiage",), ("item", "price"), ("live", "price"), ("cost",)),
    "get_stock": (("stock",), ("kucun",), ("sku", "stock"), ("inventory",), ("sku", "kucun")),
    "get_promotions": (("promotions",), ("coupons",), ("youhui",), ("deals",), ("youhui", "quan")),
    "estimate_shipping": (("shipping",), ("delivery",), ("wuliu",), ("kuaidi",), ("shipping", "fee")),
    "get_size_chart": (("size", "chart"), ("chima",), ("size", "guide"), ("chima", "biao"), ("sizes",)),
    "get_after_sales_policy": (
        ("after", "sales"),
        ("return", "policy"),
        ("shouhou",),
        ("tuihuan",),
        ("shouhou", "policy"),
    ),
    "load_skill": (("skill",), ("jineng",), ("skill", "doc"), ("playbook",), ("skill", "guide")),
}
EXTRA_VERBS: dict[str, tuple[str, ...]] = {
    "search_products": ("search", "sousuo"),
    "estimate_shipping": ("estimate", "calc", "yugu"),
    "load_skill": ("load", "open", "use", "jiazai"),
}
# Distractor tools: things no viewer task needs (impl `DISTRACTOR_PREFIX + name`).
DISTRACTOR_NOUNS: tuple[tuple[str, ...], ...] = (
    ("weather",),
    ("tianqi",),
    ("lottery",),
    ("choujiang",),
    ("fans", "rank"),
    ("fensi",),
    ("bgm",),
    ("live", "schedule"),
    ("yugao",),
    ("points",),
    ("jifen",),
    ("exchange", "rate"),
    ("huilv",),
    ("news",),
)
DISTRACTOR_DESCRIPTIONS: tuple[str, ...] = (
    "查询{x}相关信息，与商品无关。",
    "获取{x}数据，仅供主播运营参考。",
    "返回{x}的最新记录。",
    "{x}查询接口（运营后台使用）。",
)
DISTRACTOR_TOPICS: dict[str, str] = {
    "weather": "天气",
    "tianqi": "天气",
    "lottery": "抽奖",
    "choujiang": "抽奖",
    "fans": "粉丝榜",
    "fensi": "粉丝",
    "bgm": "背景音乐",
    "live": "直播排期",
    "yugao": "直播预告",
    "points": "积分",
    "jifen": "积分",
    "exchange": "汇率",
    "huilv": "汇率",
    "news": "新闻",
}
# Skill key -> noun variants for skill ids (kebab only: Agent Skills names are lowercase-hyphen).
SKILL_NOUNS: dict[str, tuple[tuple[str, ...], ...]] = {
    "product_qa": (("product", "qa"), ("shangpin", "wenda"), ("item", "facts"), ("goods", "qa"), ("product", "info")),
    "price_promotion": (("price", "promo"), ("jiage", "youhui"), ("price", "deals"), ("youhui",), ("price", "coupons")),
    "size_advice": (("size", "advice"), ("chima", "tuijian"), ("size", "guide"), ("chima",), ("fit", "advice")),
    "logistics": (("logistics",), ("wuliu",), ("shipping",), ("kuaidi", "wuliu"), ("delivery",)),
    "after_sales": (("after", "sales"), ("shouhou",), ("returns",), ("tuihuan",), ("shouhou", "service")),
    "identity_compliance": (
        ("identity", "compliance"),
        ("shenfen", "hegui"),
        ("compliance",),
        ("hegui",),
        ("ai", "disclosure"),
    ),
    "engagement": (("engagement",), ("hudong",), ("chit", "chat"), ("liaotian",), ("fans", "hudong")),
}
SKILL_SUFFIXES: tuple[str, ...] = ("", "skill", "guide", "zhinan", "playbook")
DISTRACTOR_SKILL_NOUNS: tuple[tuple[str, ...], ...] = (
    ("lottery", "rules"),
    ("choujiang",),
    ("weather", "chat"),
    ("fensi", "rank"),
    ("bgm", "request"),
    ("jifen", "rules"),
)
# Canonical argument -> noun variants (pieces) for argument names.
ARG_NOUNS: dict[str, tuple[tuple[str, ...], ...]] = {
    "product_id": (
        ("product", "id"),
        ("item", "id"),
        ("goods", "id"),
        ("shangpin", "id"),
        ("product", "no"),
        ("item", "code"),
    ),
    "sku_id": (("sku", "id"), ("sku",), ("sku", "code"), ("guige", "id"), ("variant", "id")),
    "query": (("query",), ("keyword",), ("q",), ("guanjianci",), ("search", "text")),
    "category": (("category",), ("leimu",), ("cat",), ("fenlei",)),
    "max_results": (("max", "results"), ("limit",), ("top", "k"), ("size",), ("max", "count")),
    "region": (("region",), ("diqu",), ("city",), ("address",), ("dest",)),
    "height_cm": (("height", "cm"), ("shengao",), ("height",), ("shengao", "cm")),
    "weight_kg": (("weight", "kg"), ("tizhong",), ("weight",), ("tizhong", "kg")),
    "skill": (("skill",), ("skill", "name"), ("skill", "id"), ("jineng",), ("name",)),
}
GENERIC_ARG_NOUNS: tuple[tuple[str, ...], ...] = (("value",), ("name",), ("key",), ("param",))
WRAPPER_NAMES: tuple[str, ...] = ("params", "query", "args", "request", "input", "options", "canshu", "tiaojian")
DISTRACTOR_ARGS: tuple[tuple[str, dict], ...] = (
    ("lang", {"type": "string", "description": "返回语言，默认中文。"}),
    ("verbose", {"type": "boolean", "description": "是否返回详细字段。"}),
    ("trace_id", {"type": "string", "description": "调用追踪编号，可不填。"}),
    ("page", {"type": "integer", "minimum": 1, "description": "分页页码，默认 1。"}),
    ("channel", {"type": "string", "description": "调用来源渠道，可不填。"}),
    ("yuyan", {"type": "string", "description": "语言偏好，可不填。"}),
)

SECTION_TITLES: dict[str, tuple[str, ...]] = {
    "persona": ("角色", "人设", "身份", "你的角色", "角色设定"),
    "rules": ("规则", "业务规则", "基本规则", "必须遵守的规则", "守则"),
    "style": ("风格", "回复风格", "表达要求", "语言风格"),
    "safety": ("安全", "安全要求", "合规", "安全与合规"),
    "skills": ("技能", "可用技能", "技能列表", "技能清单"),
    "constraints": ("约束", "输出约束", "格式要求", "限制"),
    "tools": ("工具", "工具说明", "工具使用"),
}
# Chinese synonym groups: a paraphrase picks one member per group and writes it for every member.
SYNONYMS: tuple[tuple[str, ...], ...] = (
    ("查询", "查找", "检索"),
    ("观众", "用户", "顾客"),
    ("必须", "务必", "一定要"),
    ("不要", "切勿", "不得"),
    ("回复", "回答", "答复"),
    ("商品", "产品", "宝贝"),
    ("简短", "简洁", "精炼"),
    ("礼貌", "客气", "友好"),
    ("如果", "假如"),
    ("根据", "依据", "基于"),
    ("然后", "接着", "随后"),
    ("推荐", "建议"),
    ("确认", "核实", "核对"),
    ("可以", "能够"),
)
BULLET_MARKERS: tuple[str, ...] = ("- ", "* ", "• ")
NUMBER_STYLES: tuple[str, ...] = ("{}. ", "{}) ", "（{}）", "{}、")
NUMBERED = re.compile(r"^(\d+[.)、] ?|（\d+）)")
SKILL_INTROS: tuple[str, ...] = ("", "本技能要点如下。", "使用本技能时请按以下说明操作。", "以下是本技能的说明。")
TOOL_DESCRIPTION_TEMPLATES: tuple[str, ...] = ("{d}", "{d}（直播间工具）", "功能：{d}", "{d} 仅返回工具数据。")

_SYN_PATTERN = re.compile("|".join(sorted((w for g in SYNONYMS for w in g), key=len, reverse=True)))
_SYN_GROUP = {w: i for i, g in enumerate(SYNONYMS) for w in g}
_WORLD_NAMES = frozenset((*TOOL_NOUNS, *(k.replace("_", "-") for k in SKILL_NOUNS), *SKILL_NOUNS))
_PASCAL = re.compile(r"^([A-Z][a-z0-9]*)+$")


def style_name(pieces: Sequence[str], style: str) -> str:
    """Writes word pieces in a naming style.

    Args:
      pieces: lowercase word pieces, e.g. ("live", "get", "price"); for "dotted" the first piece is the
        namespace, e.g. ("live", "get", "price") -> "live.get_price".
      style: "snake", "camel", "kebab", "dotted" or "pascal".
    Returns:
      the name, e.g. "live_get_price", "liveGetPrice", "live-get-price", "live.get_price", "LiveGetPrice".
    Raises:
      ValueError: unknown style or no pieces.
    """
    if not pieces:
        raise ValueError("style_name: no pieces")
    if style == "snake":
        return "_".join(pieces)
    if style == "kebab":
        return "-".join(pieces)
    if style == "camel":
        return pieces[0] + "".join(p.capitalize() for p in pieces[1:])
    if style == "pascal":
        return "".join(p.capitalize() for p in pieces)
    if style == "dotted":
        return pieces[0] + "." + "_".join(pieces[1:]) if len(pieces) > 1 else pieces[0]
    raise ValueError(f"style_name: unknown style {style!r}")


def name_style(name: str) -> str:
    """The naming style a name is written in ("dotted", "pascal", "kebab", "camel" or "snake").

    One-piece lowercase names read as "snake" (style-neutral).
    """
    if "." in name:
        return "dotted"
    if _PASCAL.match(name) and not name.isupper():
        return "pascal"
    if "-" in name:
        return "kebab"
    if any(c.isupper() for c in name):
        return "camel"
    return "snake"


def parse_tool_name(name: str) -> tuple[str, str, tuple[str, ...]] | None:
    """Splits a styled tool name into (prefix, verb, noun pieces), or None when it has no known verb.

    E.g. "live.get_price" -> ("live", "get", ("price",)); "FetchItemInfo" -> ("", "fetch", ("item", "info")).
    """
    pieces = [p.lower() for p in re.findall(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])", name)]
    all_verbs = set(VERBS).union(*EXTRA_VERBS.values())
    for i in (0, 1):
        if i < len(pieces) - 1 and pieces[i] in all_verbs and (i == 0 or pieces[0] in PREFIXES):
            return ("".join(pieces[:i]), pieces[i], tuple(pieces[i + 1 :]))
    return None


def reserved_combo(*parts: str) -> bool:
    """True for the held-out fifth of word combinations (stable CRC32 rule, same on every machine).

    Combinations that spell a world name (the impl or skill key itself, e.g. get+price, product+qa)
    are never reserved: an original harness may use them.
    """
    pieces = [p for p in parts if p]
    if "_".join(pieces) in _WORLD_NAMES or "-".join(pieces) in _WORLD_NAMES:
        return False
    return zlib.crc32("|".join(parts).encode()) % 5 == 0


def parse_skill_name(name: str) -> tuple[tuple[str, ...], str] | None:
    """Splits a skill id into (noun pieces, suffix) when it is a pool combination (prefix "live-" allowed)."""
    rest = name[5:] if name.startswith("live-") else name
    for noun in (*(n for ns in SKILL_NOUNS.values() for n in ns), *DISTRACTOR_SKILL_NOUNS):
        for suffix in SKILL_SUFFIXES:
            if rest == "-".join(noun + ((suffix,) if suffix else ())):
                return noun, suffix
    return None


@functools.cache
def _split_combos(impl: str, heldout: bool) -> tuple[tuple[str, tuple[str, ...]], ...]:
    return tuple(c for c in tool_combos(impl) if reserved_combo(c[0], *c[1]) == heldout)


@functools.cache
def _split_skill_combos(key: str, heldout: bool) -> tuple[tuple[tuple[str, ...], str], ...]:
    nouns = DISTRACTOR_SKILL_NOUNS if key == "" else SKILL_NOUNS[key]
    return tuple((n, s) for n in nouns for s in SKILL_SUFFIXES if reserved_combo(*n, s) == heldout)


def tool_combos(impl: str) -> list[tuple[str, tuple[str, ...]]]:
    """Every (verb, noun pieces) combination for a world function (distractors: `distractor`)."""
    nouns = DISTRACTOR_NOUNS if impl == "distractor" else TOOL_NOUNS[impl]
    verbs = VERBS + EXTRA_VERBS.get(impl, ())
    return [(v, n) for v in verbs for n in nouns]


def sample_tool_name(
    impl: str, style: str, rng: random.Random, *, heldout: bool, taken: set[str], prefix: str = ""
) -> str:
    """A new tool name for world function `impl` (or "distractor"), not in `taken`.

    Train draws use only non-reserved combinations, held-out draws only reserved ones; the style
    decides the family (`TRAIN_TOOL_STYLES` / `HELDOUT_TOOL_STYLES`). `prefix` ("" for none) starts
    the name; "dotted" always has a namespace (a random one of `PREFIXES` when `prefix` is "").
    Raises:
      RuntimeError: no free name after 200 draws.
    """
    combos = _split_combos(impl, heldout)
    for _ in range(200):
        verb, noun = rng.choice(combos)
        first = prefix or (rng.choice(PREFIXES) if style == "dotted" else "")
        pieces = ((first,) if first else ()) + (verb, *noun)
        name = style_name(pieces, style)
        if name not in taken and len(name) <= 64:
            return name
    raise RuntimeError(f"sample_tool_name: no free name for {impl!r} in style {style!r}")


def sample_skill_name(key: str, rng: random.Random, *, heldout: bool, taken: set[str]) -> str:
    """A new lowercase-hyphen skill id for world skill `key` ("" = distractor), not in `taken`.

    The (noun, suffix) combination is reserved or not according to `heldout`.
    Raises:
      RuntimeError: no free id after 200 draws.
    """
    combos = _split_skill_combos(key, heldout)
    for _ in range(200):
        noun, suffix = rng.choice(combos)
        prefix = ("live",) if rng.random() < 0.2 else ()
        name = "-".join(prefix + noun + ((suffix,) if suffix else ()))
        if name not in taken:
            return name
    raise RuntimeError(f"sample_skill_name: no free id for skill key {key!r}")


def sample_arg_name(canonical: str, style: str, rng: random.Random, taken: set[str]) -> str:
    """A new argument name for canonical argument `canonical`, not in `taken`.

    Raises:
      RuntimeError: no free name after 200 draws.
    """
    nouns = ARG_NOUNS.get(canonical) or ARG_NOUNS.get("skill" if "skill" in canonical else "", GENERIC_ARG_NOUNS)
    for attempt in range(200):
        pieces = rng.choice(nouns)
        if attempt >= 20:  # crowded: add a disambiguating piece
            pieces = (*pieces, rng.choice(("val", "arg", "v2")))
        name = style_name(pieces, style)
        if name not in taken:
            return name
    raise RuntimeError(f"sample_arg_name: no free name for argument {canonical!r}")


def paraphrase(text: str, rng: random.Random) -> str:
    """Rewrites `text` with one random member per synonym group (ASCII identifiers are untouched)."""
    choice: dict[int, str] = {}

    def pick(m: re.Match) -> str:
        group = _SYN_GROUP[m.group(0)]
        if group not in choice:
            choice[group] = rng.choice(SYNONYMS[group])
        return choice[group]

    return _SYN_PATTERN.sub(pick, text)
