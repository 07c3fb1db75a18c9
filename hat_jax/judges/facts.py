"""Facts in text for the rule judges: numbers in a reply, tolerant fact matching, grounding, wrong-fact cues.

Variant (documented so that a reader can predict every score):
- Numbers are Arabic-digit numbers found with a regex (`1,299` reads 1299; `199.0` reads 199.0).
  A number followed by `折` also reads as a fraction (`8折` -> 0.8, `85折` -> 0.85) and one followed by
  `%` also reads as a fraction (`20%` -> 0.2). List markers at the start of a line (`1.`, `2、`)
  are not numbers. Chinese numerals (`三天`, `两件`, `三到五天`) are read only when followed by a unit and only
  to decide that a gold fact was *stated*, never to flag an ungrounded number.
- Two numbers are equal when |a - b| <= 1e-6 * max(1, |a|, |b|), so 199 == 199.0 and the formats
  "199", "199.0", "¥199", "199元" all state the fact 199. A zero fee is also stated by "包邮"/"免运费",
  a zero stock by "售罄"/"没货".
- A string fact is stated when it occurs in the reply (case-insensitive, whitespace removed); an ASCII
  word such as a size ("L") must stand alone, so "XL" does not state "L". A range "3-5" is also
  stated as "3~5", "3到5", "3至5"; a string with digits also ignoring "元" ("满300减30" is stated by
  "满300元减30元"); "包邮" also by "免运费"/"免邮". A bool fact is stated only through the phrases in
  `BOOL_FACT_PHRASES` (keys matched by substring); a bool fact without a phrase rule is not checkable
  and is left out of the fact checks.
- Grounding pool: every number in the ok results of world tools and of the skill loader in this
  episode (numbers and numbers inside strings, walked recursively), in the viewer's message, and the
  numeric gold facts when every gold call has a matching ok call (derived facts such as a price
  difference are computable from what the agent saw). Results of distractor tools do not ground
  anything (the HAT report: facts "must come from the matching tool result").
- Wrong fact: for the gold fact keys in `fact_class`, a cue regex (e.g. `到手价 ... N`, `库存 ... N`,
  `N天...送达`, `材质是 X`, `产地是 X`) picks the value the reply attaches to that kind of fact; it is
  wrong when it equals no gold value of that class (so "A 只要199, B 只要299" with two gold prices is
  right; a material or origin is right when it contains the gold string).

Source: the HAT report, arXiv 2608.15763 (TaoLive, 2026), "Release gates and guardrails" ("Product,
price, stock and promotion facts must come from the matching tool result").
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

_NUM = re.compile(r"(?<![\d.])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_LIST_MARKER = re.compile(r"(?m)^\s*\d+(?:[、)）]|\.(?!\d))")
_CN_DIGITS = {"零": 0, "一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8, "九": 9}
_CN_UNITS = "天件个元块日周月年双套码斤小"
_CN_NUM = re.compile(rf"[零一二两三四五六七八九十百]+(?=(?:[到至~\-][零一二两三四五六七八九十百]+)?[{_CN_UNITS}])")

# Bool facts that a reply can state with a phrase: key substring -> (phrases for True, phrases for
# False); the first key substring found in the fact key wins. True is stated by a True phrase with no
# False phrase ("不包邮" contains "包邮"); False by a False phrase.
BOOL_FACT_PHRASES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "insurance": (("运费险",), ("无运费险", "没有运费险", "不送运费险", "不含运费险", "不赠送运费险")),
    "free_shipping": (("包邮", "免运费", "免邮"), ("不包邮", "不免邮", "需要运费", "要运费", "不免运费")),
    "in_stock": (("有货", "有库存", "现货"), ("售罄", "卖完", "没货", "无货", "断货", "缺货", "没有库存")),
}
_FREE_FEE_PHRASES = ("包邮", "免运费", "免邮", "不要运费", "运费0")
_SOLD_OUT_PHRASES = ("售罄", "卖完", "没货", "无货", "断货", "缺货", "没有库存")


@dataclasses.dataclass(frozen=True)
class Number:
    """A number found in text: its readings (value, and a fraction for `折`/`%`) and where it is."""

    value: float
    readings: tuple[float, ...]
    start: int
    end: int


def num_equal(a: float, b: float) -> bool:
    """Tolerant numeric equality: |a - b| <= 1e-6 * max(1, |a|, |b|)."""
    return abs(a - b) <= 1e-6 * max(1.0, abs(a), abs(b))


def is_number(v: Any) -> bool:
    """True for int/float values that are not bools."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def numbers_in(text: str) -> list[Number]:
    """The Arabic-digit numbers in `text`, list markers at line starts excluded.

    Args:
      text: any text (a reply, a tool result string).
    Returns:
      `Number`s in order of appearance.
    """
    text = text or ""
    markers = {m.start() + len(m.group()) - len(m.group().lstrip()) for m in _LIST_MARKER.finditer(text)}
    out = []
    for m in _NUM.finditer(text):
        if m.start() in markers:
            continue
        value = float(m.group().replace(",", ""))
        readings = [value]
        after = text[m.end() : m.end() + 1]
        if after == "折" and value > 0:
            readings.append(value / 10 if value < 10 else value / 100)
        elif after in ("%", "％"):
            readings.append(value / 100)
        out.append(Number(value, tuple(readings), m.start(), m.end()))
    return out


def _cn_to_int(s: str) -> int | None:
    total, cur = 0, 0
    for ch in s:
        if ch in _CN_DIGITS:
            cur = _CN_DIGITS[ch]
        elif ch == "十":
            total += (cur or 1) * 10
            cur = 0
        elif ch == "百":
            total += (cur or 1) * 100
            cur = 0
        else:
            return None
    return total + cur


def chinese_numbers_in(text: str) -> list[int]:
    """Chinese-numeral numbers followed by a unit (`三天` -> 3, `十五件` -> 15)."""
    return [v for v in (_cn_to_int(m.group()) for m in _CN_NUM.finditer(text or "")) if v is not None]


def numbers_of_value(value: Any) -> list[float]:
    """Every number in a JSON-like value: numbers, and numbers inside strings (bools and keys skipped).

    Args:
      value: a parsed tool result (dict/list/str/number) or a JSON string.
    """
    out: list[float] = []
    if is_number(value):
        out.append(float(value))
    elif isinstance(value, str):
        out.extend(n.value for n in numbers_in(value))
    elif isinstance(value, Mapping):
        for v in value.values():
            out.extend(numbers_of_value(v))
    elif isinstance(value, (list, tuple)):
        for v in value:
            out.extend(numbers_of_value(v))
    return out


def strings_of_value(value: Any) -> list[str]:
    """Every string leaf of a JSON-like value (keys skipped)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [s for v in value.values() for s in strings_of_value(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in strings_of_value(v)]
    return []


def normalise(s: str) -> str:
    """`s` with whitespace removed and case folded (the form string facts are compared in)."""
    return re.sub(r"\s+", "", s).casefold()


def _string_stated(fact: str, reply: str) -> bool:
    f, r = normalise(fact), normalise(reply)
    if not f:
        return False
    rng = re.fullmatch(r"(\d+(?:\.\d+)?)[-~～到至—](\d+(?:\.\d+)?)", f)
    if rng:
        a, b = (re.escape(x) for x in rng.groups())
        return re.search(rf"(?<![\d.]){a}(?:[-~～到至—]|天?到){b}(?![\d.])", r) is not None
    if f == "包邮":
        return any(p in r for p in _FREE_FEE_PHRASES) and "不包邮" not in r
    if re.search(r"\d", f) and f.replace("元", "") in r.replace("元", ""):
        return True
    if re.fullmatch(r"[0-9.]+", f):
        try:
            return number_stated(float(f), reply)
        except ValueError:
            pass
    if re.fullmatch(r"[a-z0-9.\-]+", f):
        return re.search(rf"(?<![a-z0-9]){re.escape(f)}(?![a-z0-9])", r) is not None
    return f in r


def number_stated(value: float, reply: str) -> bool:
    """True when some reading of a number in `reply` (or a unit-bound Chinese numeral) equals `value`."""
    if any(num_equal(x, value) for n in numbers_in(reply) for x in n.readings):
        return True
    return any(num_equal(float(v), value) for v in chinese_numbers_in(reply))


def fact_stated(key: str, value: Any, reply: str) -> bool | None:
    """Whether the reply states gold fact `key = value`; None when the fact is not checkable.

    Args:
      key: the gold fact key (used for bool facts and free shipping).
      value: str, int, float or bool.
      reply: the public reply.
    Raises:
      TypeError: when `value` is not str/int/float/bool (names `key`).
    """
    if isinstance(value, bool):
        rule = next((p for k, p in BOOL_FACT_PHRASES.items() if k in key), None)
        if rule is None:
            return None
        r = normalise(reply)
        said_false = any(p in r for p in rule[1])
        return (any(p in r for p in rule[0]) and not said_false) if value else said_false
    if is_number(value):
        if value == 0 and "fee" in key and any(p in normalise(reply) for p in _FREE_FEE_PHRASES):
            return True
        if value == 0 and "stock" in key and any(p in normalise(reply) for p in _SOLD_OUT_PHRASES):
            return True
        return number_stated(float(value), reply)
    if isinstance(value, str):
        return _string_stated(value, reply)
    raise TypeError(f"gold_facts[{key!r}] must be str, int, float or bool, got {type(value).__name__}")


def fact_in_results(value: Any, results: Iterable[Any]) -> bool:
    """Whether gold fact `value` occurs in any of the tool `results` (numbers tolerant, strings by substring)."""
    results = list(results)
    if isinstance(value, bool):
        return False
    if is_number(value):
        return any(num_equal(x, float(value)) for r in results for x in numbers_of_value(r))
    if isinstance(value, str):
        f = normalise(value)
        return bool(f) and any(f in normalise(s) for r in results for s in strings_of_value(r))
    return False


def parse_result(result: Any) -> Any:
    """A tool result as a JSON value (a JSON string is parsed; anything else is returned as it is)."""
    if isinstance(result, str):
        try:
            return json.loads(result)
        except ValueError:
            return result
    return result


def ungrounded_numbers(reply: str, pool: Iterable[float]) -> list[float]:
    """Numbers of the reply none of whose readings is in the grounding `pool` (in reply order)."""
    pool = list(pool)
    return [n.value for n in numbers_in(reply) if not any(num_equal(x, p) for x in n.readings for p in pool)]


# Fact classes for the wrong-fact check: class -> cue regex whose group 1 is the number (or size).
_SEP = r"(?:是|为|:|：|¥|￥|仅|就|才|还有|有|只有|只|约|大约|\s){0,3}"
_N = r"(\d+(?:\.\d+)?)"
FACT_CUES: dict[str, re.Pattern[str]] = {
    "list_price": re.compile(r"(?:原价|划线价|吊牌价|日常价|标价)" + _SEP + _N),
    "price": re.compile(r"(?:到手价|直播价|现价|活动价|券后价?|只要|仅需|只需|售价|价格)" + _SEP + _N),
    "stock": re.compile(r"(?:库存|还剩|仅剩|只剩|剩余)" + _SEP + _N),
    "fee": re.compile(r"运费" + _SEP + _N),
    "return_days": re.compile(_N + r"天(?:内)?(?:无理由|可退|包退|退换|退货)"),
    "ship_days": re.compile(_N + r"(?:天|个工作日)(?:左右|内)?(?:就能|能|可以|即可|就)?(?:送达|到货|送到|到|收到)"),
    "warranty": re.compile(r"(?:保修|质保)" + _SEP + _N),
    "material": re.compile(r"(?:材质|面料|材料|成分|配料)(?:是|为|：|:|用的是|采用的是|采用)([^，。！？,!?；;\s]{1,12})"),
    "origin": re.compile(r"(?:产地|原产地)(?:是|为|：|:|在)([^，。！？,!?；;\s]{1,12})"),
    "size": re.compile(r"(?:推荐|建议|选|拍|穿)[^A-Za-z\d，。！？,!?]{0,3}(\d?X{0,3}[SML](?![a-z])|XS)", re.IGNORECASE),
}


def fact_class(key: str) -> str | None:
    """The wrong-fact class of a gold fact key (see `FACT_CUES`), or None when it has no cue."""
    k = key.lower()
    if any(w in k for w in ("diff", "saving", "threshold", "min_spend")):
        return None
    if re.search(r"(list|original)_?price", k):
        return "list_price"
    if "price" in k:
        return "price"
    if "stock" in k:
        return "stock"
    if "fee" in k:
        return "fee"
    if "return" in k and "day" in k:
        return "return_days"
    if "day" in k and (any(w in k for w in ("ship", "deliver", "eta", "arriv")) or k.startswith("days")):
        return "ship_days"
    if "warranty" in k:
        return "warranty"
    if "size" in k:
        return "size"
    if "material" in k:
        return "material"
    if "origin" in k:
        return "origin"
    return None


def wrong_facts(reply: str, gold_facts: Mapping[str, Any]) -> list[str]:
    """Cue-attached values in `reply` that contradict the gold facts, as readable strings.

    For every fact class that has at least one gold value, each cue match whose value equals no gold
    value of that class is a wrong fact ("price: 189 (gold 199)").
    """
    by_class: dict[str, list[Any]] = {}
    for k, v in gold_facts.items():
        c = fact_class(k)
        if c is not None and not isinstance(v, bool) and (is_number(v) or isinstance(v, str)):
            by_class.setdefault(c, []).append(v)
    out = []
    text = re.sub(r"(?<=\d),(?=\d{3})", "", reply or "")
    for c, golds in by_class.items():
        for m in FACT_CUES[c].finditer(text):
            got = m.group(1)
            if c == "size":
                ok = any(isinstance(g, str) and normalise(g) == normalise(got) for g in golds)
            elif c in ("material", "origin"):
                ok = any(isinstance(g, str) and normalise(g) in normalise(got) for g in golds)
            else:
                ok = any(is_number(g) and num_equal(float(got), float(g)) for g in golds) or any(
                    isinstance(g, str) and _string_stated(g, got) for g in golds
                )
            if not ok:
                out.append(f"{c}: {got} (gold {', '.join(str(g) for g in golds)})")
    return out
