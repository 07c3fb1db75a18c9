"""results.json aggregation, its schema check, and the Markdown tables (hand-computed values)."""

import copy

import pytest

from hat_jax.experiments.declarations import load_all
from hat_jax.experiments.results import (aggregate, check_results, experiment_markdown, group_markdown, mean_interval,
                                         mtp_summary)


def _metrics(x: float, ifeval=True) -> dict:
    four = {"prompt_strict": x, "inst_strict": x, "prompt_loose": x, "inst_loose": x}
    return {"live_qa": {"acc": x, "eff": x, "avg": x}, "variant_qa": {"acc": x, "eff": x, "avg": x},
            "tool_robustness": {"adr": x, "rc": x, "tc": x, "avg": x},
            "prompt_robustness": {"adr": x, "llm": x, "tco": x, "avg": x},
            "ifeval": dict(four) if ifeval else None, "ifeval_mini": dict(four)}


def test_mean_interval_hand_computed():
    # values 10, 20, 30: mean 20, s = 10, t_{0.975, 2} = 4.302652729911275, half = 4.3026527 * 10 / sqrt(3)
    mean, lo, hi = mean_interval([10.0, 20.0, 30.0])
    assert mean == 20.0
    assert hi - mean == pytest.approx(4.302652729911275 * 10 / 3 ** 0.5, rel=1e-9)
    assert mean - lo == pytest.approx(hi - mean)
    assert mean_interval([7.0]) == (7.0, 7.0, 7.0)


def test_aggregate_means_and_null_ifeval():
    mean, intervals = aggregate([_metrics(10.0), _metrics(30.0)])
    assert mean["live_qa"] == {"acc": 20.0, "eff": 20.0, "avg": 20.0}
    # n = 2: t_{0.975, 1} = 12.706204736174698, s = 14.142135623730951, half = 12.7062 * 14.1421 / sqrt 2 = 127.06,
    # so [-107.06, 147.06], clipped to the metric's range
    assert intervals["live_qa"]["avg"] == [0.0, 100.0]
    mean, intervals = aggregate([_metrics(60.0), _metrics(62.0), _metrics(67.0)])
    # mean 63, s = sqrt((9 + 1 + 16) / 2) = 3.605551, half = 4.302652729911275 * 3.605551 / sqrt 3 = 8.956686
    assert mean["live_qa"]["acc"] == 63.0
    assert intervals["live_qa"]["acc"] == [54.0433, 71.9567]
    # IFE-P of one seed, 63/541 = 11.645...: kept to 4 decimals, so the table prints 11.6 as the log does
    mean, _ = aggregate([_metrics(63 / 541 * 100)])
    assert mean["live_qa"]["acc"] == 11.6451 and f"{mean['live_qa']['acc']:.1f}" == "11.6"
    mean, _ = aggregate([_metrics(10.0), _metrics(30.0, ifeval=False)])
    assert mean["ifeval"] is None and mean["ifeval_mini"]["prompt_strict"] == 20.0


def _results():
    m = _metrics(50.0)
    return {"experiment": "table6_both", "preset": "micro", "seeds": [0], "wall_s": 1.0,
            "stages": [{"name": "sft", "harness": "hsa", "steps": 2, "wall_s": 0.5}], "metrics": m,
            "per_seed": [copy.deepcopy(m)]}


def test_check_results_accepts_the_schema_and_names_bad_fields():
    check_results(_results())
    bad = copy.deepcopy(_results())
    bad["metrics"]["live_qa"]["avg"] = 120.0
    with pytest.raises(ValueError, match=r"metrics\.live_qa\.avg = 120\.0; expected a number in \[0, 100\]"):
        check_results(bad)
    bad = copy.deepcopy(_results())
    del bad["stages"][0]["harness"]
    with pytest.raises(ValueError, match=r"stages\[0\] lacks 'harness'"):
        check_results(bad)
    bad = copy.deepcopy(_results())
    bad["per_seed"][0]["ifeval_mini"] = {"prompt_strict": 1.0}
    with pytest.raises(ValueError, match=r"per_seed\[0\]\.ifeval_mini must hold"):
        check_results(bad)
    bad = copy.deepcopy(_results())
    del bad["per_seed"][0]["variant_qa"]
    with pytest.raises(ValueError, match=r"per_seed\[0\] lacks 'variant_qa'"):
        check_results(bad)
    not_run = copy.deepcopy(_results())  # --set eval.suites='["live_qa"]': the other suites are null
    for suite in ("variant_qa", "tool_robustness", "prompt_robustness", "ifeval_mini"):
        not_run["metrics"][suite] = not_run["per_seed"][0][suite] = None
    check_results(not_run)


def test_group_table_puts_ours_beside_the_paper():
    group = load_all()["table6"]
    res = _results()
    table = group_markdown(group, {"table6_both": res}, "micro")
    line = next(l for l in table.splitlines() if l.startswith("| table6_both"))
    assert line == "| table6_both | 50.0 (81.3) | 50.0 | 50.0 (93.3) | 50.0 |"
    assert "| table6_standard | not run (71.3) | not run | not run | not run |" in table


def test_results_md_splits_the_time_and_says_why_ifeval_was_skipped():
    experiment = next(r for r in load_all()["table6"].rows if r.name == "table6_both")
    res = _results()
    res.update(wall_s=700.0, wall_s_this_invocation=90.0, eval_wall_s=[100.0],
               stages=[{"name": "sft", "harness": "hsa", "steps": 100, "wall_s": 400.0, "cached": True},
                       {"name": "rl", "harness": "hsa", "steps": 4, "wall_s": 200.0, "cached": False}],
               base={"trained": False, "wall_s": 0.01, "report": {"wall_s": 307.4}},
               extra=[{"ifeval": {"skipped": "no IFEval data: pass --ifeval-data FILE"}}])
    res["metrics"]["ifeval"] = None
    md = experiment_markdown(res, experiment)
    assert ("Wall time 700 s: base cached (pretrained once in 307 s), stages trained here 200 s, evaluation 100 s "
            "(the last command took 90 s).") in md
    assert "| sft | hsa | 100 | 400 | reused (another experiment trained it) |" in md
    assert "| rl | hsa | 4 | 200 | here |" in md
    assert "IFEval skipped: no IFEval data: pass --ifeval-data FILE." in md
    assert "| IFEval prompt strict | skipped |" in md
    res["base"] = {"trained": True, "wall_s": 310.0, "report": {"wall_s": 307.4}}
    assert "base 307 s (pretrained here)" in experiment_markdown(res, experiment)
    table = group_markdown(load_all()["table6"], {"table6_both": res}, "micro")
    assert table.endswith("\nIFEval skipped: no IFEval data: pass --ifeval-data FILE.\n")  # Table 6 has an IFE-P column


def _seed(seed: int, acceptance: float | None, positions: int = 40) -> dict:
    figures = None if acceptance is None else {"acceptance_depth1": acceptance, "mean_accepted_length": 1 + acceptance,
                                               "positions": positions, "episodes": 2}
    return {"seed": seed, "checkpoint": f"/runs/stages/sft-hsa.rl-hsa-abc/seed{seed}", "metrics": {"mtp": figures}}


def test_mtp_summary_means_over_seeds_and_is_checked():
    # seeds 0, 1: 10/40 = 0.25 and 14/40 = 0.35 accepted; mean 0.3, mean accepted length 1.3
    block = mtp_summary([_seed(0, 0.25), _seed(1, 0.35)])
    assert {k: block[k] for k in ("acceptance_depth1", "mean_accepted_length", "positions", "episodes")} == {
        "acceptance_depth1": 0.3, "mean_accepted_length": 1.3, "positions": 80, "episodes": 4}
    assert block["per_seed"][1] == {"seed": 1, "checkpoint": "/runs/stages/sft-hsa.rl-hsa-abc/seed1",
                                    "acceptance_depth1": 0.35, "mean_accepted_length": 1.35, "positions": 40,
                                    "episodes": 2}
    partial = mtp_summary([_seed(0, 0.25), _seed(1, None)])       # a seed not measured: no mean, as for suites
    assert partial["acceptance_depth1"] is None and partial["positions"] == 40
    assert partial["per_seed"][1]["acceptance_depth1"] is None
    assert mtp_summary([_seed(0, None)]) is None and mtp_summary([{"seed": 0, "metrics": {}}]) is None
    res = dict(_results(), seeds=[0, 1], per_seed=[_results()["per_seed"][0]] * 2, mtp=block)
    check_results(res)
    check_results(dict(res, mtp=partial))
    check_results(dict(res, mtp=None))
    bad = copy.deepcopy(res)
    bad["mtp"]["per_seed"][0]["acceptance_depth1"] = 25.0          # a percentage, not a share
    with pytest.raises(ValueError, match=r"mtp\.per_seed\[0\]\.acceptance_depth1 = 25\.0; expected a share in \[0, 1\]"):
        check_results(bad)
    bad = copy.deepcopy(res)
    bad["mtp"]["mean_accepted_length"] = 2.3
    with pytest.raises(ValueError, match=r"mtp\.mean_accepted_length = 2\.3; expected 1 \+ acceptance_depth1"):
        check_results(bad)
    with pytest.raises(ValueError, match=r"mtp must be null or hold acceptance_depth1"):
        check_results(dict(res, mtp={"acceptance_depth1": 0.3}))


def test_results_md_has_the_mtp_section():
    experiment = next(r for r in load_all()["table6"].rows if r.name == "table6_both")
    res = dict(_results(), mtp=mtp_summary([_seed(0, 0.25)]))
    md = experiment_markdown(res, experiment)
    section = md[md.index("## MTP draft acceptance"):]
    assert section.startswith("## MTP draft acceptance\n\nDepth-1 acceptance 0.2500, mean accepted length 1.2500; "
                              "40 positions in 2 held-out Live QA oracle episodes.\n")
    assert "greedy draft equals the main model's greedy next token, teacher-forced at depth 1" in section
    assert "mean accepted length (tokens per verifying forward) is 1 + acceptance" in section
    assert ("experiments/benchmarks/spec_decode_bench.py --checkpoint /runs/stages/sft-hsa.rl-hsa-abc/seed0 --k 1"
            in section and "export/check_vllm.py HF_DIR --mtp 1" in section)
    two = dict(_results(), seeds=[0, 1], mtp=mtp_summary([_seed(0, 0.25), _seed(1, 0.35)]))
    md = experiment_markdown(two, experiment)
    assert "mean accepted length 1.3000 (mean over 2 seeds); 80 positions in 4" in md
    assert "- seed 1: 0.3500 (40 positions)" in md
    none = dict(_results(), mtp=None, extra=[{"mtp": {"skipped": "EvalConfig.mtp_items is 0"}}])
    assert "## MTP draft acceptance\n\nNot measured: EvalConfig.mtp_items is 0.\n" in experiment_markdown(none, experiment)
