"""The claims C1-C5: each verdict of each condition kind, and a claim judged on hand-made results."""

import importlib.util
import json
from pathlib import Path

import pytest

from hat_jax.experiments.claims import CLAIMS, Condition, claims_markdown, condition_verdict, judge, load_run_results
from hat_jax.experiments.declarations import METRIC_PATHS, load_all
from hat_jax.experiments.intervals import Interval

from test_intervals import A, B, row  # tests/experiments is on sys.path (pytest, rootdir without __init__)

ROOT = Path(__file__).resolve().parents[2]
REP, NOT, SEP = "replicated", "not replicated", "not separable at this scale"


def _iv(point, low, high):
    return Interval(point, low, high, "test")


def test_every_claim_names_declared_rows_and_metrics():
    rows = {r.name for g in load_all().values() for r in g.rows}
    assert [c.name for c in CLAIMS] == ["C1", "C2", "C3", "C4", "C5"]
    for claim in CLAIMS:
        for cond in claim.conditions:
            assert set(cond.rows) <= rows and {cond.minuend[1], cond.subtrahend[1]} <= set(METRIC_PATHS)


@pytest.mark.parametrize("cond, interval, verdict", [
    (Condition(("a", "p"), ("b", "p")), _iv(5, 1, 9), REP),
    (Condition(("a", "p"), ("b", "p")), _iv(-5, -9, -1), NOT),              # significant, opposite sign
    (Condition(("a", "p"), ("b", "p")), _iv(4, -1, 9), SEP),                # crosses 0
    (Condition(("a", "p"), ("b", "p")), _iv(4, None, None), SEP),           # no interval
    (Condition(("a", "p"), ("b", "p"), margin=10), _iv(12, 2, 22), REP),
    (Condition(("a", "p"), ("b", "p"), margin=10), _iv(8, 2, 14), SEP),     # above 0 but short of the margin
    (Condition(("a", "p"), ("b", "p"), margin=10), _iv(5, 1, 9), NOT),      # rules the margin out
    (Condition(("a", "p"), ("b", "p"), "within", 3), _iv(0.5, -2, 2.9), REP),
    (Condition(("a", "p"), ("b", "p"), "within", 3), _iv(6, 3.5, 9), NOT),
    (Condition(("a", "p"), ("b", "p"), "within", 3), _iv(1, -5, 7), SEP),
    (Condition(("a", "p"), ("b", "p"), "at_least", 2), _iv(0, -1.5, 1.5), REP),
    (Condition(("a", "p"), ("b", "p"), "at_least", 2), _iv(-6, -9, -3), NOT),
    (Condition(("a", "p"), ("b", "p"), "at_least", 2), _iv(-1, -4, 2), SEP),
])
def test_condition_verdicts(cond, interval, verdict):
    assert condition_verdict(cond, interval) == verdict


def test_disjoint_needs_the_cells_intervals_apart():
    cond = Condition(("a", "p"), ("b", "p"), margin=10, disjoint=True)
    apart, overlapping = (_iv(80, 70, 90), _iv(60, 50, 69)), (_iv(80, 65, 90), _iv(60, 50, 70))
    assert condition_verdict(cond, _iv(20, 12, 28), apart) == REP
    assert condition_verdict(cond, _iv(20, 12, 28), overlapping) == SEP


def test_a_claim_on_hand_made_results():
    c3 = next(c for c in CLAIMS if c.name == "C3")
    ifp = "ifeval_mini.prompt_strict"
    sft = row("table4_fixed_sft", {ifp: [B]})
    assert judge(c3, {"table4_fixed_sft": sft}) == ("not run", ["- not run: table4_fixed_opd"])
    verdict, lines = judge(c3, {"table4_fixed_sft": sft, "table4_fixed_opd": row("table4_fixed_opd", {ifp: [A]})})
    # means 1600 / 22 = 72.73 and 750 / 22 = 34.09; the interval: the fixed-seed bootstrap (test_intervals)
    assert verdict == REP and lines == [
        "- table4_fixed_opd IF-mini prompt strict - table4_fixed_sft IF-mini prompt strict = +38.6 [+22.7, +56.8] "
        "(paper +8.5); claimed > 0: replicated (percentile bootstrap over 22 paired items (1 seed))"]
    verdict, _ = judge(c3, {"table4_fixed_sft": row("table4_fixed_sft", {ifp: [A]}),
                            "table4_fixed_opd": row("table4_fixed_opd", {ifp: [B]})})
    assert verdict == NOT
    same = row("table4_fixed_opd", {ifp: [[100.0, 0.0] * 11]})
    assert judge(c3, {"table4_fixed_sft": row("table4_fixed_sft", {ifp: [[0.0, 100.0] * 11]}),
                      "table4_fixed_opd": same})[0] == SEP
    verdict, lines = judge(c3, {"table4_fixed_sft": row("table4_fixed_sft", {ifp: [B]}, eval_key="e2"),
                                "table4_fixed_opd": row("table4_fixed_opd", {ifp: [A]})})
    assert verdict.startswith("refused: table4_fixed_opd and table4_fixed_sft used different eval sets")


def test_claims_section_and_cli(tmp_path):
    for name, values in (("table4_fixed_sft", B), ("table4_fixed_opd", A)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(row(name, {"ifeval_mini.prompt_strict": [values]})))
    results = load_run_results(tmp_path)
    assert sorted(results) == ["table4_fixed_opd", "table4_fixed_sft"]
    text = claims_markdown(results)
    assert "**C1: not run.**" in text and "**C3: replicated.** general OPD restores" in text
    assert "- not run: table3_base, table3_fixed_sft, table4_hsa_sft" in text
    spec = importlib.util.spec_from_file_location("claims_cli", ROOT / "experiments" / "claims.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    assert cli.main([str(tmp_path)]) == 0 and (tmp_path / "claims.md").read_text() == text
    assert cli.main([str(tmp_path / "empty")]) == 2
