"""Reading metrics: do an episode's calls name what its harness offers, load the right skill, complete the gold chain.

Not metrics of the HAT report: they show directly whether a model reads its harness (the names, skills and tool
chain it was given), beside the report's metrics of every live-stream suite; they never enter AVG. Judged, like the rule
judges, under the harness the episode ran under (a suite item's own harness: the renamed names under Variant QA).

Per episode (`episode_reading`):
- calls: `len(Episode.tool_calls)`, skill loads and failed calls included.
- valid_calls: the calls whose name exists in the harness (`HarnessState.tool`) and, for a skill-loader call, whose
  skill id (read from the surface arguments as the executor reads it, `hat_jax.sim.executor.skill_argument`) names a
  skill of the harness. A skill id is a name read from the context like a tool name, so one count covers both: the
  original tool name, or the original skill id, called under a renamed harness is an invalid name.
- skill: `rules.skill_selection` (1: the first loaded skill is bound to `Task.skill_key` and loaded before any world
  tool call; 0 otherwise, also when no skill was loaded); None when the task needs no skill (`Task.skill_key` "";
  every task the viewer generator draws names one, so in the suites every episode counts).
- chain: 1 when every gold call was made in gold group order (`gold.gold_chain_reasons`: TCO's order check without
  the prompt's tool_order constraints; no skill load is part of the chain); None when the task has no gold call
  (identity, chit-chat, off-topic, injection tasks).
- fetched: 1 when some ok world-tool result holds a checkable gold fact (`rules.returned_facts`: the answer reached
  the context); None when the task has no checkable gold fact (`rules.checkable_facts`: identity, chit-chat,
  off-topic, injection tasks, and gold facts with no phrase rule).
- relayed: RC (`rules.rc`: the reply states every returned gold fact) of an episode that fetched; None otherwise.
  Reading a tool result, apart from finding it.
- abstained: 1 when the episode is accurate (`rules.accuracy` 1) and its reply states none of the task's checkable
  gold facts: Accuracy earned by saying nothing (a refusal, a greeting, a deliberate no_reply); None when the
  task has no checkable gold fact.

Per suite (`reading_scores`), on the 0-100 scale but calls_per_ep:
- name_valid = 100 x sum(valid_calls) / sum(calls), pooled over the suite's calls; None ("no calls") when no
  episode called a tool.
- skill_acc = 100 x mean(skill) over the episodes that need a skill; None when none does.
- chain_done = 100 x mean(chain) over the episodes whose task has gold calls; None when none has.
- calls_per_ep = sum(calls) / episodes, a count (`COUNT_KEYS`): with it an abstaining model is visible, as a
  validity of 100 over 3 calls is no reading.
- fact_fetched = 100 x mean(fetched), relayed = 100 x mean(relayed) over the episodes that fetched, abstained =
  100 x mean(abstained), each None when its denominator is empty. A gain in Accuracy with abstained rising by as
  much is a gain from abstaining, not from answering.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hat_jax.harness.state import SKILL_TOOL_IMPL, HarnessState
from hat_jax.judges import rules
from hat_jax.judges.gold import gold_chain_reasons
from hat_jax.sim.executor import skill_argument
from hat_jax.sim.types import Episode, ToolCallRecord

READING_KEYS: tuple[str, ...] = ("name_valid", "skill_acc", "chain_done", "fact_fetched", "relayed", "abstained",
                                  "calls_per_ep")
COUNT_KEYS: tuple[str, ...] = ("calls_per_ep",)  # counts, not on 0-100: >= 0, no upper bound
# Why a reading metric is None (its denominator is empty), as results.md says it.
UNDEFINED: dict[str, str] = {"name_valid": "no calls", "skill_acc": "no task needs a skill",
                             "chain_done": "no task has gold calls", "fact_fetched": "no task has a checkable fact",
                             "relayed": "no gold fact fetched", "abstained": "no task has a checkable fact"}
# What one episode lacks when a metric gives it no weight (as an interval's refusal says it).
UNDEFINED_ITEM: dict[str, str] = {"name_valid": "call", "skill_acc": "skill to load", "chain_done": "gold call",
                                  "fact_fetched": "checkable gold fact", "relayed": "gold fact fetched",
                                  "abstained": "checkable gold fact"}


def _share(field: str) -> Callable[[Mapping[str, Any]], tuple[float, float]]:
    return lambda r: (0.0, 0.0) if r[field] is None else (100.0 * r[field], 1.0)


# Every reading metric as a ratio of sums over a suite's episodes: key -> (the `EpisodeReading` fields it reads,
# one episode's (numerator, denominator) from those fields). The suite value is sum(numerators) /
# sum(denominators), None when the denominators sum to 0, so it is the weighted mean of numerator / denominator
# with the denominators as weights: name_valid weighs an episode by its calls, a share weighs 1 where it is
# defined and 0 elsewhere, calls_per_ep is a plain mean. `reading_scores` and the item bootstrap
# (`hat_jax.experiments.intervals`) both read this table.
RATIO_TERMS: dict[str, tuple[tuple[str, ...], Callable[[Mapping[str, Any]], tuple[float, float]]]] = {
    "name_valid": (("calls", "valid_calls"), lambda r: (100.0 * r["valid_calls"], float(r["calls"]))),
    **{key: ((field,), _share(field)) for key, field in (("skill_acc", "skill"), ("chain_done", "chain"),
                                                          ("fact_fetched", "fetched"), ("relayed", "relayed"),
                                                          ("abstained", "abstained"))},
    "calls_per_ep": (("calls",), lambda r: (float(r["calls"]), 1.0)),
}


@dataclasses.dataclass(frozen=True)
class EpisodeReading:
    """One episode's reading counts (module docstring): calls, valid_calls >= 0; skill, chain, fetched, relayed,
    abstained 0/1 or None (None where the module docstring says)."""

    calls: int
    valid_calls: int
    skill: int | None
    chain: int | None
    fetched: int | None
    relayed: int | None
    abstained: int | None


def valid_name(call: ToolCallRecord, harness: HarnessState) -> bool:
    """Whether `call` names a tool of `harness` and, when that tool loads skills, a skill of it (module docstring)."""
    tool = harness.tool(call.name)
    if tool is None:
        return False
    if tool.impl != SKILL_TOOL_IMPL:
        return True
    skill = skill_argument(tool, call.arguments) if isinstance(call.arguments, Mapping) else None
    return isinstance(skill, str) and harness.skill(skill) is not None


def fact_reading(episode: Episode) -> tuple[int | None, int | None, int | None]:
    """(fetched, relayed, abstained) of `episode` (module docstring), each 0/1 or None; needs no harness."""
    stated = rules.checkable_facts(episode)
    if not stated:
        return None, None, None
    fetched = int(bool(rules.returned_facts(episode)))
    relayed = int(rules.rc(episode).value) if fetched else None
    return fetched, relayed, int(rules.accuracy(episode).value == 1 and not any(stated.values()))


def episode_reading(episode: Episode, harness: HarnessState) -> EpisodeReading:
    """The reading counts of `episode` under `harness`, the harness it ran under (module docstring)."""
    calls = episode.tool_calls
    skill = int(rules.skill_selection(episode, harness).value) if episode.task.skill_key else None
    chain = int(not gold_chain_reasons(episode)) if episode.task.gold_calls else None
    return EpisodeReading(len(calls), sum(valid_name(c, harness) for c in calls), skill, chain, *fact_reading(episode))


def reading_scores(readings: Sequence[EpisodeReading]) -> dict[str, float | None]:
    """A suite's reading metrics from its episodes' counts: {key: value or None} in `READING_KEYS` order, 0-100
    but calls_per_ep (calls per episode); None where the denominator is empty (`UNDEFINED`, module docstring).
    Each value is the ratio of sums of `RATIO_TERMS`.

    Raises:
      ValueError: no episodes.
    """
    if not readings:
        raise ValueError("reading_scores: no episodes to score")
    rows = [vars(r) for r in readings]
    return {key: ratio_of_sums(key, rows) for key in READING_KEYS}


def ratio_of_sums(key: str, rows: Sequence[Mapping[str, Any]]) -> float | None:
    """The reading metric `key` over episodes' counts `rows` (`EpisodeReading` fields as a mapping, e.g. an
    evaluation record's "reading"): sum of `RATIO_TERMS` numerators / sum of denominators; None when the
    denominators sum to 0.

    Raises:
      KeyError: an unknown key, or a row without a field the metric reads.
    """
    terms = [RATIO_TERMS[key][1](r) for r in rows]
    denominator = sum(d for _, d in terms)
    return sum(n for n, _ in terms) / denominator if denominator else None
