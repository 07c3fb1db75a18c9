"""The HAT report's central claims C1-C5, each judged on a run directory's results: replicated, not replicated,
not separable at this scale, or not run.

A claim is a few conditions; a condition is a difference of two cells (row, metric path) with its 95% interval
(`hat_jax.experiments.intervals.difference_interval`: paired by seed, and by item within one suite) and what the
claim says of it:
- "greater" (margin m >= 0): the minuend exceeds the subtrahend by at least m. Replicated when the interval lies
  above 0 and the difference is >= m (with `disjoint`, also the two cells' own intervals do not overlap); not
  replicated when the interval lies below m (for m = 0: significant with the opposite sign).
- "within" (margin m): |difference| <= m. Replicated when the interval lies inside [-m, m] (equivalence by two
  one-sided tests, Schuirmann 1987, here at the stricter 95% interval); not replicated when it lies outside.
- "at_least" (margin m): the minuend is not below the subtrahend by more than m (non-inferiority). Replicated
  when the interval's low end is above -m; not replicated when its high end is below -m.
Anything else is "not separable at this scale". A claim is replicated when every condition is, not replicated
when some condition is not, "not run" when one of its rows has no results.json, "refused: <reason>" when an
interval is refused (too few items, different eval sets or seeds), else not separable.

Metrics: the in-domain IF-mini gauge (`ifeval_mini.prompt_strict`) stands for IFEval's IFE-P (at the tiny
scale the official IFEval may be skipped); the paper's differences (`paper`) are of IFE-P. C1's and C2's conditions
are the tiny scale's targets (docs/results.md); the paper's own numbers are in `paper` (../shared/PAPER.md).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hat_jax.experiments.declarations import METRIC_LABELS
from hat_jax.experiments.intervals import Interval, difference_interval

VERDICTS = ("replicated", "not replicated", "not separable at this scale", "not run")
IFP = "ifeval_mini.prompt_strict"


@dataclasses.dataclass(frozen=True)
class Condition:
    """minuend - subtrahend, each (row, metric path); kind "greater" | "within" | "at_least" with its margin
    (module docstring); paper: the paper's difference (None: not reported)."""

    minuend: tuple[str, str]
    subtrahend: tuple[str, str]
    kind: str = "greater"
    margin: float = 0.0
    paper: float | None = None
    disjoint: bool = False

    @property
    def rows(self) -> tuple[str, str]:
        return self.minuend[0], self.subtrahend[0]


@dataclasses.dataclass(frozen=True)
class Claim:
    name: str
    text: str
    conditions: tuple[Condition, ...]


CLAIMS: tuple[Claim, ...] = (
    Claim("C1", "HSA beats fixed-harness SFT on Harness-Variant QA (paper: 94.6 vs 88.2): fixed SFT's Variant QA "
                "below its Live QA, HAT's within 3 points of its Live QA, HAT above fixed SFT on Variant QA", (
        Condition(("table3_fixed_sft", "live_qa.avg"), ("table3_fixed_sft", "variant_qa.avg"), "greater", 0.0,
                  paper=1.3),
        Condition(("table3_hat", "variant_qa.avg"), ("table3_hat", "live_qa.avg"), "within", 3.0, paper=-0.2),
        Condition(("table3_hat", "variant_qa.avg"), ("table3_fixed_sft", "variant_qa.avg"), paper=6.4))),
    Claim("C2", "fixed SFT costs general instruction following, HSA-SFT does not (IFE-P 73.8 vs 81.7, base 81.5): "
                "fixed SFT's IF-mini prompt-strict below the base's, HSA-SFT's within 2 points of it or above", (
        Condition(("table3_base", IFP), ("table3_fixed_sft", IFP), paper=7.7),
        Condition(("table4_hsa_sft", IFP), ("table3_base", IFP), "at_least", 2.0, paper=0.2))),
    Claim("C3", "general OPD restores instruction following after fixed SFT (IFE-P 73.8 -> 82.3)", (
        Condition(("table4_fixed_opd", IFP), ("table4_fixed_sft", IFP), paper=8.5),)),
    Claim("C4", "perturbing SFT gives most of Table 6's IFEval gain (+9.4 of +10.0): HSA-SFT alone above the "
                "standard chain, and above HSA-RL alone", (
        Condition(("table6_sft_only", IFP), ("table6_standard", IFP), paper=9.4),
        Condition(("table6_sft_only", IFP), ("table6_rl_only", IFP), paper=8.4))),
    Claim("C5", "RL >= distillation from the same start (Table 5), in the original and the HSA environment", tuple(
        Condition((f"table5_rl_{env}", path), (f"table5_distill_{env}", path), "at_least", 2.0, paper=paper)
        for env, numbers in (("original", (0.1, 0.2, 4.8)), ("hsa", (0.9, 1.8, 2.1)))
        for path, paper in zip(("live_qa.avg", IFP, "prompt_robustness.avg"), numbers))),
)


def condition_verdict(condition: Condition, interval: Interval, cells: tuple[Interval, Interval] | None = None) -> str:
    """One of VERDICTS[:3] for `condition` given the difference's interval (module docstring); `cells`: the two
    cells' own intervals, needed for `disjoint`."""
    lo, hi, m = interval.low, interval.high, condition.margin
    if lo is None:
        return VERDICTS[2]
    if condition.kind == "greater":
        overlap = (cells is not None and (cells[0].low is None or cells[1].low is None or
                                          cells[0].low <= cells[1].high))
        if lo > 0 and interval.point >= m and not (condition.disjoint and overlap):
            return VERDICTS[0]
        return VERDICTS[1] if hi < m else VERDICTS[2]
    if condition.kind == "within":
        if -m <= lo and hi <= m:
            return VERDICTS[0]
        return VERDICTS[1] if lo > m or hi < -m else VERDICTS[2]
    if condition.kind == "at_least":
        if lo > -m:
            return VERDICTS[0]
        return VERDICTS[1] if hi < -m else VERDICTS[2]
    raise ValueError(f"condition kind {condition.kind!r}; expected greater, within or at_least")


def _label(cell: tuple[str, str]) -> str:
    suite, key = cell[1].split(".")
    return f"{cell[0]} {METRIC_LABELS[suite]} {key.replace('_', ' ')}"


def judge(claim: Claim, results: Mapping[str, Mapping[str, Any]]) -> tuple[str, list[str]]:
    """(the claim's verdict, one Markdown line per condition) on `results` (row name -> results.json)."""
    missing = sorted({row for c in claim.conditions for row in c.rows if row not in results})
    if missing:
        return VERDICTS[3], [f"- not run: {', '.join(missing)}"]
    verdicts, lines = [], []
    for c in claim.conditions:
        a, b = results[c.minuend[0]], results[c.subtrahend[0]]
        paper = "" if c.paper is None else f" (paper {c.paper:+.1f})"
        what = f"{_label(c.minuend)} - {_label(c.subtrahend)}"
        try:
            iv = difference_interval(a, c.minuend[1], b, c.subtrahend[1])
            cells = (difference_interval(a, c.minuend[1]), difference_interval(b, c.subtrahend[1])) if c.disjoint else None
        except ValueError as err:
            verdicts.append(f"refused: {err}")
            lines.append(f"- {what}: refused: {err}")
            continue
        verdict = condition_verdict(c, iv, cells)
        verdicts.append(verdict)
        span = "no interval" if iv.low is None else f"[{iv.low:+.1f}, {iv.high:+.1f}]"
        claim_text = {"greater": f"> 0, at least {c.margin:g}" if c.margin else "> 0",
                      "within": f"within +-{c.margin:g}", "at_least": f">= -{c.margin:g}"}[c.kind]
        disjoint = ", cells' intervals disjoint" if c.disjoint else ""
        lines.append(f"- {what} = {iv.point:+.1f} {span}{paper}; claimed {claim_text}{disjoint}: {verdict} "
                     f"({iv.method})")
    refused = [v for v in verdicts if v.startswith("refused")]
    if refused:
        return refused[0], lines
    if all(v == VERDICTS[0] for v in verdicts):
        return VERDICTS[0], lines
    return (VERDICTS[1] if VERDICTS[1] in verdicts else VERDICTS[2]), lines


def claims_markdown(results: Mapping[str, Mapping[str, Any]], claims: Sequence[Claim] = CLAIMS) -> str:
    """The "Claims" section: each claim's verdict and its conditions' differences with their 95% intervals."""
    lines = ["## Claims C1-C5 (95% intervals)", "",
             "Verdicts: replicated (the interval is on the paper's side of 0 and meets the stated size), not "
             "replicated (the interval excludes the claim), not separable at this scale (the interval is too wide to "
             "tell), not run (a row has no results); `hat_jax.experiments.claims`, docs/results.md.", ""]
    for claim in claims:
        verdict, detail = judge(claim, results)
        lines += [f"**{claim.name}: {verdict}.** {claim.text}.", ""] + detail + [""]
    return "\n".join(lines)


def load_run_results(out_dir: str | Path) -> dict[str, dict]:
    """Every finished row of a run directory: {row name: its results.json} for each `DIR/<row>/results.json`."""
    found = {}
    for path in sorted(Path(out_dir).glob("*/results.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        found[data["experiment"]] = data
    return found
