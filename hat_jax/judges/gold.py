"""Matching an episode's tool calls against its task's gold plan (used by the rule judges and the reading metrics).

A task's gold plan (`Task.gold_calls`) is groups of (impl, canonical arguments); a call matches a gold call
when it has that impl and its canonical arguments contain the gold ones (numbers tolerant, strings case- and
space-insensitive, a region by its province), except that a search's query is free text: any non-empty query
whose ok result lists the gold search's product (`gold_products`). Calls with status "invalid_arguments" or
"unknown_tool" never match.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from hat_jax.judges import facts
from hat_jax.sim.tools import ToolError, resolve_region
from hat_jax.sim.types import Episode, ToolCallRecord

FAILED_STATUSES = ("error", "timeout", "empty")
BAD_STATUSES = ("invalid_arguments", "unknown_tool")


def gold_plan(episode: Episode) -> list[tuple[int, str, Mapping[str, Any]]]:
    """The task's gold calls flattened to (group index, impl, canonical args), in plan order."""
    return [(g, impl, args) for g, group in enumerate(episode.task.gold_calls) for impl, args in group]


def gold_products(episode: Episode) -> list[tuple[str, ...]]:
    """For each gold call (plan order), the products an ok search must list to stand for it.

    A search's query is free text, so a search call stands for a gold search when its ok result lists
    the product that gold search is for: the k-th gold search of a plan with one search per task
    product (a comparison: search a, search b) is for the k-th product; otherwise (and for non-search
    calls, where the entry is unused) the task's products.
    """
    plan, pids = gold_plan(episode), tuple(episode.task.product_ids)
    n_search = sum(impl == "search_products" for _, impl, _ in plan)
    per_search = n_search > 1 and n_search == len(pids)
    out, k = [], 0
    for _, impl, _ in plan:
        if impl == "search_products" and per_search:
            out.append((pids[k],))
            k += 1
        else:
            out.append(pids)
    return out


def _region(value: str) -> str:
    try:
        return resolve_region(value)
    except ToolError:
        return facts.normalise(value)


def _value_eq(key: str, a: Any, b: Any) -> bool:
    if facts.is_number(a) and facts.is_number(b):
        return facts.num_equal(float(a), float(b))
    if isinstance(a, str) and isinstance(b, str):
        if key == "region":
            return _region(a) == _region(b)
        return facts.normalise(a) == facts.normalise(b)
    return a == b


def args_match(canonical: Mapping[str, Any], gold: Mapping[str, Any]) -> bool:
    """True when `canonical` holds every gold argument with an equal value (extra arguments allowed).

    Numbers compare tolerantly, strings case- and space-insensitively, a `region` by the province it
    resolves to (`hat_jax.sim.tools.resolve_region`: "深圳", "广东省" and "广东" are equal).
    """
    return all(k in canonical and _value_eq(k, canonical[k], v) for k, v in gold.items())


def matches_gold(call: ToolCallRecord, impl: str, args: Mapping[str, Any], product_ids: Sequence[str] = ()) -> bool:
    """Whether `call` is the gold call (impl, args); a search's free-text query only has to find one of
    `product_ids` (the gold call's entry of `gold_products`) when it returned ok."""
    if call.status in BAD_STATUSES or call.impl != impl:
        return False
    if impl == "search_products":
        query = call.canonical_args.get("query")
        if not isinstance(query, str) or not query.strip():
            return False
        found = json.dumps(facts.parse_result(call.result), ensure_ascii=False)
        return call.status != "ok" or not product_ids or any(pid in found for pid in product_ids)
    return args_match(call.canonical_args, args)


def match_gold_calls(episode: Episode) -> list[int | None]:
    """For each gold call (plan order), the index in `episode.tool_calls` of the first unused matching call."""
    used: set[int] = set()
    out: list[int | None] = []
    for (_, impl, args), pids in zip(gold_plan(episode), gold_products(episode)):
        calls = enumerate(episode.tool_calls)
        idx = next((i for i, c in calls if i not in used and matches_gold(c, impl, args, pids)), None)
        if idx is not None:
            used.add(idx)
        out.append(idx)
    return out


def gold_chain_reasons(episode: Episode) -> tuple[str, ...]:
    """Why the episode's calls do not complete its gold chain; () when they do (and for a task without gold calls).

    The chain is complete when every gold call was made (`match_gold_calls`: not "invalid_arguments" or
    "unknown_tool"; an environment failure still counts as making it) and the last matched call of each gold
    group comes before the first matched call of every later group (calls within a group in any order).
    """
    plan, idx = gold_plan(episode), match_gold_calls(episode)
    if any(i is None for i in idx):
        return ("a gold call is missing, so the order is not the gold order",)
    groups: dict[int, list[int]] = {}
    for (g, _, _), i in zip(plan, idx):
        groups.setdefault(g, []).append(i)
    order = sorted(groups)
    return tuple(f"gold group {b} called before group {a} finished" for a, b in zip(order, order[1:])
                 if max(groups[a]) > min(groups[b]))


def gold_ok(episode: Episode) -> list[bool]:
    """For each gold call (plan order), whether some ok call matches it (`matches_gold`, `gold_products`)."""
    return [
        any(c.status == "ok" and matches_gold(c, impl, args, pids) for c in episode.tool_calls)
        for (_, impl, args), pids in zip(gold_plan(episode), gold_products(episode))
    ]


def failed_gold_calls(episode: Episode) -> list[tuple[str, Mapping[str, Any]]]:
    """The gold calls (impl, canonical args) that were tried, failed (error/timeout/empty) and never returned ok.

    Judged per gold call, not per tool: a call tries gold call (impl, args) when it has that impl and
    its canonical args match (`args_match`); a search's query is free text, so a search tries the gold
    search with the same query (whitespace and case ignored), or every gold search when its query is
    none of theirs. A gold call returned ok when an ok call matches it (`_matches` with its
    `gold_products` entry): an ok search for the other product of a comparison does not make up for
    the failed one.
    """
    plan = gold_plan(episode)
    gold_queries = {facts.normalise(str(a.get("query", ""))) for _, i, a in plan if i == "search_products"}

    def tries(c: ToolCallRecord, impl: str, args: Mapping[str, Any]) -> bool:
        if c.impl != impl or c.status not in FAILED_STATUSES:
            return False
        if impl != "search_products":
            return args_match(c.canonical_args, args)
        query = facts.normalise(str(c.canonical_args.get("query", "")))
        return bool(query) and (query == facts.normalise(str(args.get("query", ""))) or query not in gold_queries)

    return [
        (impl, args)
        for (_, impl, args), ok in zip(plan, gold_ok(episode))
        if not ok and any(tries(c, impl, args) for c in episode.tool_calls)
    ]
