"""The rule judges' metric table entry (`JudgeMetric`) and its check: one row per metric, from which the
judgement, the suites' metric lists and the result columns derive (the table itself: `rules.JUDGE_METRICS`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class JudgeMetric:
    """One rule-judge metric, a row of `rules.JUDGE_METRICS`.

    Attributes:
      name: the `Judgement` field and `Judgement.scores()` key (hand labels use it too).
      judge: (episode, harness) -> MetricResult.
      values: the values it takes, e.g. (0, 1) (stored as int) or (0, 0.5, 1); None for a fraction in [0, 1].
      short: its key in a suite's results (results.json, tables); "" means the name.
      suites: the live-stream suites that report it (`hat_jax.data.suites.SUITES`).
    """

    name: str
    judge: Callable[..., Any]
    values: tuple[float, ...] | None
    short: str = ""
    suites: tuple[str, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "short", self.short or self.name)

    def cast(self, value: float) -> int | float:
        """`value` as the `Judgement` field stores it: int for a 0/1 metric, else float."""
        return int(value) if self.values == (0, 1) else float(value)


def check_metric_table(table: Sequence[JudgeMetric], judgement_fields: Sequence[str],
                       other_fields: Sequence[str] = ()) -> None:
    """Refuses an incomplete or inconsistent metric table (called at import on `rules.JUDGE_METRICS`);
    `other_fields` are the `Judgement` fields that are not metrics.

    Raises:
      ValueError: naming the metric and the key: a repeated name or short key, a judge that is not
        callable, values that are not numbers in [0, 1], or a metric without its `Judgement` field (or a
        `Judgement` metric field without a table row).
    """
    seen: dict[str, str] = {}
    for m in table:
        for key, label in ((m.name, "name"), (m.short, "short")):
            if key in seen and not (label == "short" and seen[key] == m.name):
                raise ValueError(f"judge metric {m.name!r}: {label} {key!r} is already used by {seen[key]!r}")
            seen[key] = m.name
        if not callable(m.judge):
            raise ValueError(f"judge metric {m.name!r}: judge must be a function (episode, harness) -> MetricResult")
        if m.values is not None and not (m.values and all(isinstance(v, (int, float)) and 0 <= v <= 1
                                                          for v in m.values)):
            raise ValueError(f"judge metric {m.name!r}: values = {m.values!r}; expected numbers in [0, 1] or None")
    names = [m.name for m in table]
    missing = [n for n in names if n not in judgement_fields]
    if missing:
        raise ValueError(f"judge metric {missing[0]!r}: Judgement has no field {missing[0]!r}")
    extra = [f for f in judgement_fields if f not in names and f not in other_fields]
    if extra:
        raise ValueError(f"Judgement field {extra[0]!r}: no judge metric {extra[0]!r} in the table")
