"""results.json aggregation, its schema check, and the Markdown tables (hand-computed values)."""

import copy

import pytest

from hat_jax.experiments.declarations import load_all
from hat_jax.experiments.results import (aggregate, check_results, experiment_markdown, group_markdown, mean_interval,
                                         mtp_summary)


def _metrics(x: float, ifeval=True, reading: dict | None = None) -> dict:
    """Every suite's metrics at x; `reading`: the reading metrics of every live suite (None: a results.json
    written before them, without the keys)."""
    four = {"prompt_strict": x, "inst_strict": x, "prompt_loose": x, "inst_loose": x}
    r = dict(reading or {})
    return {"live_qa": {"acc": x, "eff": x, "avg": x, **r}, "variant_qa": {"acc": x, "eff": x, "avg": x, **r},
            "tool_robustness": {"adr": x, "rc": x, "tc": x, "avg": x, **r},
            "prompt_robustness": {"adr": x, "llm": x, "tco": x, "avg": x, **r},
            "ifeval": dict(four) if ifeval else None, "ifeval_mini": dict(four)}


def _reading(valid, calls=2.0, skill=40.0, chain=25.0) -> dict:
    return {"name_valid": valid, "skill_acc": skill, "chain_done": chain, "fact_fetched": 60.0, "relayed": 50.0,
            "abstained": 30.0, "calls_per_ep": calls}


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
    assert group.columns[4:] == ("live_qa.name_valid", "variant_qa.name_valid", "live_qa.chain_done",
                                 "live_qa.abstained")
    res = _results()  # written before the reading metrics: their columns say so
    table = group_markdown(group, {"table6_both": res}, "micro")
    line = next(l for l in table.splitlines() if l.startswith("| table6_both"))
    assert line == ("| table6_both | 50.0 (81.3) | 50.0 | 50.0 (93.3) | 50.0 | not measured | not measured | "
                    "not measured | not measured |")
    assert ("| table6_standard | not run (71.3) | not run | not run | not run | not run | not run | not run | "
            "not run |") in table
    assert table.splitlines()[4] == ("| row | IFEval prompt strict | IF-mini prompt strict | Live QA avg | Variant QA avg | "
                                     "Live QA name validity | Variant QA name validity | Live QA gold chain done | "
                                     "Live QA abstained |")
    m = _metrics(50.0, reading=_reading(92.5))
    m["variant_qa"]["name_valid"] = None
    table = group_markdown(group, {"table6_both": dict(_results(), metrics=m, per_seed=[m])}, "micro")
    line = next(l for l in table.splitlines() if l.startswith("| table6_both"))
    assert line.endswith("| 50.0 | 92.5 | no calls | 25.0 | 30.0 |")
    assert ("Name validity, skill selection, gold chain done, fact fetched, relayed, abstained and calls / episode "
            "show reading directly") in table


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
    res["base"] = {"trained": False, "wall_s": 0.01, "report": {"wall_s": 307.4, "chain_wall_s": 912.6}}
    assert "base cached (pretrained once in 913 s)" in experiment_markdown(res, experiment)  # every phase
    res["base"] = {"trained": True, "wall_s": 310.0, "report": {"wall_s": 307.4}}
    assert "base 307 s (pretrained here)" in experiment_markdown(res, experiment)
    table = group_markdown(load_all()["table6"], {"table6_both": res}, "micro")
    assert table.endswith("\nIFEval skipped: no IFEval data: pass --ifeval-data FILE.\n")  # Table 6 has an IFE-P column
    # which harness the world was written under (a results.json from before the field: production)
    assert "; world harness production." in md and "World harness: production." in table
    res["world_harness"] = "compact"
    assert "; world harness compact." in experiment_markdown(res, experiment)
    assert "World harness: compact." in group_markdown(load_all()["table6"], {"table6_both": res}, "micro")


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


def test_reading_metrics_aggregate_with_their_ranges_and_nulls():
    seeds = [_metrics(50.0, reading=_reading(v, calls=c)) for v, c in ((80.0, 150.0), (90.0, 160.0), (100.0, 170.0))]
    mean, intervals = aggregate(seeds)
    # name_valid 80, 90, 100: mean 90, s = 10, half = 4.302652729911275 * 10 / sqrt 3 = 24.8414, clipped at 100
    assert mean["live_qa"]["name_valid"] == 90.0 and intervals["live_qa"]["name_valid"] == [65.1586, 100.0]
    # calls_per_ep is a count: 150, 160, 170 -> mean 160, not clipped at 100
    assert mean["variant_qa"]["calls_per_ep"] == 160.0 and intervals["variant_qa"]["calls_per_ep"] == [135.1586, 184.8414]
    assert list(mean["live_qa"]) == ["acc", "eff", "avg", "name_valid", "skill_acc", "chain_done", "fact_fetched",
                                     "relayed", "abstained", "calls_per_ep"]
    # one seed made no call: its validity is null, so the mean is null and has no interval; the others stand
    seeds[1]["live_qa"]["name_valid"] = None
    mean, intervals = aggregate(seeds)
    assert mean["live_qa"]["name_valid"] is None and "name_valid" not in intervals["live_qa"]
    assert mean["live_qa"]["skill_acc"] == 40.0 and mean["variant_qa"]["name_valid"] == 90.0
    # a seed evaluated before the reading metrics existed (a cached evaluation): the keys are left out
    mean, intervals = aggregate([seeds[0], _metrics(50.0)])
    assert list(mean["live_qa"]) == ["acc", "eff", "avg"] and list(intervals["live_qa"]) == ["acc", "eff", "avg"]


def test_check_results_takes_reading_metrics_nulls_and_old_files():
    m = _metrics(50.0, reading=_reading(None, calls=0.0, skill=0.0, chain=None))  # an abstaining model
    res = dict(_results(), metrics=m, per_seed=[copy.deepcopy(m)])
    check_results(res)
    res["metrics"]["live_qa"]["calls_per_ep"] = 150.0  # a count may pass 100
    check_results(res)
    check_results(_results())  # a results.json written before the reading metrics
    for suite, key, value, expected in (("live_qa", "name_valid", 120.0, r"a number in \[0, 100\]"),
                                        ("variant_qa", "calls_per_ep", -1.0, "a number >= 0"),
                                        ("live_qa", "acc", None, r"a number in \[0, 100\]")):
        bad = copy.deepcopy(res)
        bad["per_seed"][0][suite][key] = value
        with pytest.raises(ValueError, match=rf"per_seed\[0\]\.{suite}\.{key} = {value}; expected {expected}"):
            check_results(bad)
    bad = copy.deepcopy(res)
    del bad["metrics"]["live_qa"]["eff"]
    with pytest.raises(ValueError, match=r"metrics\.live_qa must hold acc, eff, avg, got"):
        check_results(bad)


def test_results_md_shows_reading_metrics_and_why_one_is_missing():
    experiment = next(r for r in load_all()["table3"].rows if r.name == "table3_hat")
    seeds = [_metrics(50.0, reading=_reading(v)) for v in (80.0, 90.0, 100.0)]
    seeds[2]["variant_qa"]["name_valid"] = None
    mean, intervals = aggregate(seeds)
    res = dict(_results(), seeds=[0, 1, 2], metrics=mean, intervals=intervals, per_seed=seeds)
    check_results(res)
    md = experiment_markdown(res, experiment)
    assert "| Live QA name validity | 90.0 [65.2, 100.0] |  |" in md  # no paper number
    assert "| Variant QA name validity | no calls (1 of 3 seeds) |  |" in md
    assert "| Live QA calls / episode | 2.0 [2.0, 2.0] |  |" in md and "| Tool rob. skill selection | 40.0" in md
    assert "| Live QA avg | 50.0 [50.0, 50.0] | 94.8 |" in md  # AVG unchanged, beside the paper's
    assert "calls whose tool name, and for a skill load whose skill id, exists in the harness" in md
    old = experiment_markdown(_results(), experiment)  # a results.json without the reading metrics renders
    assert "| Live QA name validity | not measured |  |" in old and "| Live QA avg | 50.0 | 94.8 |" in old
    table = group_markdown(load_all()["table3"], {"table3_hat": res}, "micro")
    assert "| 90.0 [65.2, 100.0] | no calls (1 of 3 seeds) | 25.0 [25.0, 25.0] |" in table
