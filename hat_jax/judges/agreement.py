"""The hand-labelled judge-calibration set and the rule judges' agreement with it (count, %, Cohen's kappa).

`hand_labels.yaml` (beside this file) holds small hand-made episodes across intents (right answers,
wrong price, ungrounded number, human claim, refund promise, missing tool, wrong skill, distractor
tool, over-length reply, obeyed injection, ...) with labels a person assigned by reading the reply
(Accuracy, Effectiveness and, where meaningful, ADR, RC, TC, LLM, TCO, Tool Rationality, Skill
Selection). The episodes run under `label_harness()`, a fixed small harness built here (surface names
differ from the impls, so the judges' name mapping is exercised), with three prompt constraints:
`max_chars` 80, `forbidden_phrase` "家人们", `tool_order` get_price -> get_promotions.

File format: a mapping with `anchors` (YAML anchors for shared tool calls and tasks, not read) and
`episodes`, a list of records. Record format:
  id, note, task (`hat_jax.sim.types.task_from_dict` fields; task_id/seed optional),
  calls: [[surface name, arguments, status, result], ...] (impl looked up in the harness,
    canonical_args = arguments since the label harness's arg paths are the identity; {} when invalid;
    a 5th element overrides the round, default = position + 1),
  reply, outcome (default "replied"), labels: {metric: value}.
Loaded skills are the `name` arguments of ok calls to the skill tool.

Agreement: per metric, over the items that label it: n, agreeing count, percent, and Cohen's kappa
(Cohen 1960, "A coefficient of agreement for nominal scales"): kappa = (p_o - p_e) / (1 - p_e) with
p_o the observed agreement and p_e = sum_c p_label(c) * p_judge(c) the chance agreement from the two
marginals; values are categories (Tool Rationality rounded to 2 decimals). kappa is NaN when
p_e = 1 (both raters used one and the same category), where it is undefined.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from importlib import resources
from typing import Any

import yaml

from hat_jax.harness.state import (
    DISTRACTOR_PREFIX, SKILL_TOOL_IMPL, Constraint, HarnessState, PromptSection, Skill, Tool,
)
from hat_jax.judges.rules import JUDGE_METRICS, METRICS, Judgement, judge_episode
from hat_jax.sim.types import Episode, ToolCallRecord, task_from_dict

# surface tool name -> (impl, canonical argument names)
_TOOLS: dict[str, tuple[str, tuple[str, ...]]] = {
    "search_goods": ("search_products", ("query",)),
    "item_detail": ("get_product_detail", ("product_id",)),
    "price_query": ("get_price", ("product_id",)),
    "stock_query": ("get_stock", ("sku_id",)),
    "promo_query": ("get_promotions", ("product_id",)),
    "ship_estimate": ("estimate_shipping", ("product_id", "region")),
    "size_chart": ("get_size_chart", ("product_id", "height_cm", "weight_kg")),
    "after_sales": ("get_after_sales_policy", ("product_id",)),
    "use_skill": (SKILL_TOOL_IMPL, ("name",)),
    "weather_query": (DISTRACTOR_PREFIX + "weather_query", ("city",)),
}
_SKILLS: dict[str, str] = {
    "product-qa": "product_qa", "price-promo": "price_promotion", "size-guide": "size_advice",
    "shipping-info": "logistics", "after-sales": "after_sales", "identity": "identity_compliance", "chat": "engagement",
}


def label_harness() -> HarnessState:
    """The fixed harness the hand-labelled episodes ran under (see the module docstring)."""
    tools = tuple(
        Tool(
            name=name, description=f"{impl} ({name})",
            input_schema={"type": "object", "properties": {a: {"type": "string"} for a in args}, "required": [args[0]]},
            impl=impl, arg_paths={a: (a,) for a in args},
        )
        for name, (impl, args) in _TOOLS.items()
    )
    skills = tuple(Skill(name=n, description=f"{k} 技能", body=f"# {n}\n先查工具再回答。", key=k) for n, k in _SKILLS.items())
    sections = (
        PromptSection("persona", "角色", "你是直播间的AI主播助手。"),
        PromptSection("rules", "规则", "商品、价格、库存、优惠信息必须来自工具结果。"),
        PromptSection(
            "style", "风格", "简短亲切。",
            constraints=(Constraint("max_chars", {"n": 80}), Constraint("forbidden_phrase", {"phrase": "家人们"})),
        ),
        PromptSection("constraints", "工具顺序", "", constraints=(Constraint("tool_order", {"first": "get_price", "then": "get_promotions"}),)),
    )
    return HarnessState(name="label", version="label-1", skill_tool="use_skill", skills=skills, tools=tools, sections=sections)


@dataclasses.dataclass(frozen=True)
class LabelledEpisode:
    """One hand-labelled episode: id, a one-line note, the episode, and the hand labels (metric -> value)."""

    id: str
    note: str
    episode: Episode
    labels: Mapping[str, float]


def _episode(item: Mapping[str, Any], harness: HarnessState) -> Episode:
    iid = item["id"]
    task = task_from_dict({"task_id": iid, "seed": 0, **item["task"]})
    calls, skills = [], []
    for i, raw in enumerate(item.get("calls", ())):
        if not 4 <= len(raw) <= 5:
            raise ValueError(f"hand label {iid!r}: calls[{i}] must be [name, arguments, status, result(, round)], got {raw!r}")
        name, args, status, result = raw[:4]
        tool = harness.tool(name)
        impl = tool.impl if tool is not None and status != "unknown_tool" else ""
        canon = dict(args) if status not in ("invalid_arguments", "unknown_tool") else {}
        calls.append(ToolCallRecord(round=raw[4] if len(raw) == 5 else i + 1, name=name, impl=impl, arguments=dict(args),
                                    canonical_args=canon, status=status, result=result))
        if impl == SKILL_TOOL_IMPL and status == "ok":
            skills.append(args["name"])
    reply = item.get("reply", "")
    messages = ({"role": "user", "content": task.message}, {"role": "assistant", "content": reply, "reasoning_content": ""})
    return Episode(task=task, harness_version=harness.version, messages=messages, tool_calls=tuple(calls), reply=reply,
                   loaded_skills=tuple(skills), outcome=item.get("outcome", "replied"))


def load_hand_labels(text: str | None = None, harness: HarnessState | None = None) -> list[LabelledEpisode]:
    """The hand-labelled episodes.

    Args:
      text: YAML text in the module's record format; None reads the packaged `hand_labels.yaml`.
      harness: the harness to bind tool names with; None uses `label_harness()`.
    Raises:
      ValueError: a malformed record or an unknown label metric, naming the record id.
    """
    if text is None:
        text = resources.files("hat_jax.judges").joinpath("hand_labels.yaml").read_text(encoding="utf-8")
    harness = harness or label_harness()
    data = yaml.safe_load(text)
    if not isinstance(data, Mapping) or not isinstance(data.get("episodes"), list):
        raise ValueError("hand labels: expected a mapping with an `episodes` list (and optional `anchors`)")
    out = []
    for item in data["episodes"]:
        for key in ("id", "task", "labels"):
            if key not in item:
                raise ValueError(f"hand label {item.get('id', '?')!r} lacks {key!r}")
        unknown = sorted(set(item["labels"]) - set(METRICS))
        if unknown:
            raise ValueError(f"hand label {item['id']!r}: unknown metrics {unknown}; known {METRICS}")
        out.append(LabelledEpisode(item["id"], item.get("note", ""), _episode(item, harness), dict(item["labels"])))
    ids = [x.id for x in out]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ValueError(f"hand labels: duplicate ids {dupes}")
    return out


def cohen_kappa(a: Sequence[Hashable], b: Sequence[Hashable]) -> float:
    """Cohen's kappa of two raters' categorical labels: (p_o - p_e) / (1 - p_e); NaN when p_e = 1.

    Raises:
      ValueError: different lengths or no labels.
    """
    if len(a) != len(b) or not a:
        raise ValueError(f"cohen_kappa needs two equal-length non-empty label lists, got {len(a)} and {len(b)}")
    n = len(a)
    p_o = sum(x == y for x, y in zip(a, b)) / n
    ca, cb = Counter(a), Counter(b)
    p_e = sum(ca[c] * cb[c] for c in ca) / (n * n)
    return math.nan if p_e == 1 else (p_o - p_e) / (1 - p_e)


_FRACTIONS = frozenset(m.name for m in JUDGE_METRICS if m.values is None)


def _cat(metric: str, value: float) -> float:
    """A label as a category: fractions (`JudgeMetric.values` None) rounded to 2 decimals."""
    return round(float(value), 2) if metric in _FRACTIONS else float(value)


def judge_agreement(
    labelled: Sequence[LabelledEpisode] | None = None,
    harness: HarnessState | None = None,
    judgements: Mapping[str, Judgement] | None = None,
) -> dict[str, dict[str, Any]]:
    """Agreement of the rule judges with the hand labels, per metric.

    Args:
      labelled: the labelled episodes (default: `load_hand_labels()`).
      harness: the harness they ran under (default: `label_harness()`).
      judgements: id -> Judgement to compare instead of running `judge_episode`.
    Returns:
      metric -> {"n", "agree", "percent" (0-100), "kappa", "disagree": [ids]} for every metric
      that at least one item labels.
    """
    harness = harness or label_harness()
    labelled = load_hand_labels(harness=harness) if labelled is None else labelled
    if judgements is None:
        judgements = {x.id: judge_episode(x.episode, harness) for x in labelled}
    out = {}
    for m in METRICS:
        rows = [(x.id, _cat(m, x.labels[m]), _cat(m, getattr(judgements[x.id], m))) for x in labelled if m in x.labels]
        if not rows:
            continue
        hand, judge = [r[1] for r in rows], [r[2] for r in rows]
        agree = sum(h == j for h, j in zip(hand, judge))
        out[m] = {
            "n": len(rows), "agree": agree, "percent": 100.0 * agree / len(rows), "kappa": cohen_kappa(hand, judge),
            "disagree": [i for i, h, j in rows if h != j],
        }
    return out
