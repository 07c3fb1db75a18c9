"""Checkable prompt instructions: the registry behind `Constraint` (the LLM and TCO metrics).

Variant implemented and why: IFEval-style verifiable instructions (IFEval, Zhou et al. 2023, arXiv
2311.07911) for the prompt-robustness metrics of the HAT report, arXiv 2608.15763 (TaoLive, 2026),
"Evaluation sets and metrics": LLM = the reply follows the prompt's instruction constraints, TCO =
tool calls are in the right order.
Each entry pairs a Chinese text template (what the system prompt says) with a rule check (what the
judge verifies), so a prompt section that states a constraint and the metric that scores it cannot
drift apart, and an HSA variant that changes a constraint's parameters changes both.

`tool_order` names tool *impls* in its kwargs; its text uses the harness's current surface names, so
it stays true under tool renames. Its check is vacuous when `then` was never called: the constraint
says what must come first *if* the second tool is used.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hat_jax.harness.state import Constraint, HarnessState

_EMOJI = re.compile("[\U0001f000-\U0001faff\u2600-\u27bf\u2b00-\u2bff\ufe0f]")
_BULLET_LINE = re.compile(r"^\s*([-*•·]|\d+[.、)）]|[（(]?\d+[)）])\s*", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class ConstraintSpec:
    """One registered constraint kind.

    Attributes:
      id: registry key (`Constraint.id`).
      template: Chinese instruction text, `str.format`-ed with the kwargs (tool_order: with the surface
        names `first_name`, `then_name`).
      params_schema: JSON Schema of the kwargs (checked on harness load).
      check: (reply, tool impls called in order, kwargs) -> True when the constraint holds.
    """

    id: str
    template: str
    params_schema: Mapping[str, Any]
    check: Callable[[str, Sequence[str], Mapping[str, Any]], bool]


def _tool_order_ok(calls: Sequence[str], kw: Mapping[str, Any]) -> bool:
    """Every call of kw["then"] comes after some call of kw["first"] (vacuous if `then` is never called)."""
    if kw["then"] not in calls:
        return True
    first = calls.index(kw["first"]) if kw["first"] in calls else len(calls)
    return first < calls.index(kw["then"])


def _obj(props: dict, required: Sequence[str] = ()) -> dict:
    return {"type": "object", "properties": props, "required": list(required), "additionalProperties": False}


_PHRASE = {"type": "string", "minLength": 1}
_POS_INT = {"type": "integer", "minimum": 1}

CONSTRAINT_REGISTRY: dict[str, ConstraintSpec] = {
    c.id: c
    for c in (
        ConstraintSpec(
            "max_chars", "回复不超过{n}字。", _obj({"n": _POS_INT}, ["n"]), lambda r, _c, kw: len(r.strip()) <= kw["n"]
        ),
        ConstraintSpec(
            "min_chars", "回复不少于{n}字。", _obj({"n": _POS_INT}, ["n"]), lambda r, _c, kw: len(r.strip()) >= kw["n"]
        ),
        ConstraintSpec(
            "must_include",
            "回复中要包含“{phrase}”。",
            _obj({"phrase": _PHRASE}, ["phrase"]),
            lambda r, _c, kw: kw["phrase"] in r,
        ),
        ConstraintSpec(
            "address_term", "称呼观众为“{term}”。", _obj({"term": _PHRASE}, ["term"]), lambda r, _c, kw: kw["term"] in r
        ),
        ConstraintSpec(
            "start_with",
            "回复以“{phrase}”开头。",
            _obj({"phrase": _PHRASE}, ["phrase"]),
            lambda r, _c, kw: r.strip().startswith(kw["phrase"]),
        ),
        ConstraintSpec(
            "end_with",
            "回复以“{phrase}”结尾。",
            _obj({"phrase": _PHRASE}, ["phrase"]),
            lambda r, _c, kw: r.strip().endswith(kw["phrase"]),
        ),
        ConstraintSpec(
            "forbidden_phrase",
            "不要说“{phrase}”。",
            _obj({"phrase": _PHRASE}, ["phrase"]),
            lambda r, _c, kw: kw["phrase"] not in r,
        ),
        ConstraintSpec("no_exclamation", "不使用感叹号。", _obj({}), lambda r, _c, _kw: "！" not in r and "!" not in r),
        ConstraintSpec("no_emoji", "不使用表情符号。", _obj({}), lambda r, _c, _kw: not _EMOJI.search(r)),
        ConstraintSpec(
            "no_bullets", "不使用列表或编号，一段话回答。", _obj({}), lambda r, _c, _kw: not _BULLET_LINE.search(r)
        ),
        ConstraintSpec(
            "tool_order",
            "先调用 {first_name}，再调用 {then_name}。",
            _obj({"first": _PHRASE, "then": _PHRASE}, ["first", "then"]),
            lambda _r, calls, kw: _tool_order_ok(calls, kw),
        ),
    )
}


def constraint_text(constraint: Constraint, harness: HarnessState | None = None) -> str:
    """The Chinese instruction for `constraint` as the system prompt states it.

    Args:
      constraint: a `Constraint` whose id is in `CONSTRAINT_REGISTRY`.
      harness: needed for tool_order (its `first`/`then` impls become the current surface names).
    Returns:
      one line of text, e.g. "回复不超过120字。".
    Raises:
      KeyError: unknown constraint id, or a tool_order impl that no tool of `harness` is bound to.
      ValueError: tool_order without a harness.
    """
    spec = _spec(constraint.id)
    kwargs = dict(constraint.kwargs)
    if constraint.id == "tool_order":
        if harness is None:
            raise ValueError("tool_order text needs the harness (to name the current tools)")
        for role in ("first", "then"):
            tool = harness.tool_by_impl(kwargs[role])
            if tool is None:
                raise KeyError(
                    f"tool_order.{role}: no tool of harness {harness.name!r} is bound to impl {kwargs[role]!r}"
                )
            kwargs[f"{role}_name"] = tool.name
    return spec.template.format(**kwargs)


def check_constraint(constraint: Constraint, reply: str, tool_impls_called: Sequence[str] = ()) -> bool:
    """True when `reply` (and the order of `tool_impls_called`) satisfies `constraint`.

    Args:
      constraint: a `Constraint` whose id is in `CONSTRAINT_REGISTRY`.
      reply: the final public reply.
      tool_impls_called: the impls of the tool calls made, in order (`ToolCallRecord.impl`).
    Raises:
      KeyError: unknown constraint id.
    """
    return bool(_spec(constraint.id).check(reply, list(tool_impls_called), constraint.kwargs))


def check_all(
    harness: HarnessState, reply: str, tool_impls_called: Sequence[str] = ()
) -> list[tuple[Constraint, bool]]:
    """Every constraint of `harness`'s prompt with whether it holds, in section order."""
    return [(c, check_constraint(c, reply, tool_impls_called)) for c in harness.constraints()]


def check_episode(episode: Any, harness: HarnessState) -> list[tuple[Constraint, bool]]:
    """`check_all` on an `Episode`: its final reply and the impls of all its tool calls, in order."""
    return check_all(harness, episode.reply, [call.impl for call in episode.tool_calls])


def _spec(constraint_id: str) -> ConstraintSpec:
    spec = CONSTRAINT_REGISTRY.get(constraint_id)
    if spec is None:
        raise KeyError(f"unknown constraint id {constraint_id!r}; known: {', '.join(CONSTRAINT_REGISTRY)}")
    return spec
