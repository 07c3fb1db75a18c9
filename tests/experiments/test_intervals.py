"""Intervals of metrics and differences from per-item scores (hand-made scores; scipy.stats.bootstrap as the
reference for the bootstrap, hand computation for the seeds + items rule)."""

import json

import numpy as np
import pytest
from scipy import stats

from hat_jax.experiments import intervals as iv
from hat_jax.experiments.declarations import load_all
from hat_jax.experiments.results import experiment_markdown, group_markdown


def row(name, cells, seeds=(0,), eval_key="e1", ids=None):
    """A results.json dict: cells {"suite.key": [[per-item scores] per seed]}; the metrics are their means."""
    per_seed = [{} for _ in seeds]
    items = {}
    for path, values in cells.items():
        suite, key = path.split(".")
        n = len(values[0])
        block = items.setdefault(suite, {"ids": list(ids or [f"{suite}-{i:05d}" for i in range(n)]), "scores": {},
                                         "weights": {}})
        block["scores"][key] = [list(map(float, v)) for v in values]
        for s, v in enumerate(values):
            per_seed[s].setdefault(suite, {})[key] = float(np.mean(v))
    metrics = {suite: {k: float(np.mean([m[suite][k] for m in per_seed])) for k in block}
               for suite, block in per_seed[0].items()}
    return {"experiment": name, "preset": "micro", "seeds": list(seeds), "per_seed": per_seed, "metrics": metrics,
            "items": items, "eval_key": eval_key, "stages": [], "wall_s": 0.0}


def live(values, suite="live_qa"):
    """Every key of a live suite with the same per-item scores."""
    return {f"{suite}.{k}": values for k in ("acc", "eff", "avg")}


def scipy_percentile(data, statistic, paired):
    res = stats.bootstrap(data, statistic, vectorized=True, paired=paired, n_resamples=iv.N_RESAMPLES,
                          batch=iv.BOOTSTRAP_BATCH, method="percentile", rng=np.random.default_rng(iv.BOOTSTRAP_SEED))
    return res.confidence_interval.low, res.confidence_interval.high


A = [100, 0, 100, 100, 50, 100, 0, 100, 100, 50, 100, 100, 0, 100, 50, 100, 100, 100, 0, 100, 50, 100]  # 22 items
B = [0, 0, 100, 50, 0, 100, 0, 0, 100, 0, 50, 100, 0, 0, 0, 100, 50, 0, 0, 100, 0, 0]


def test_one_seed_metric_and_paired_difference_are_scipys_percentile_bootstrap():
    a, b = row("t_a", {"live_qa.avg": [A]}), row("t_b", {"live_qa.avg": [B]})
    cell = iv.difference_interval(a, "live_qa.avg")
    lo, hi = scipy_percentile((np.array(A, float),), lambda x, axis: x.mean(axis), paired=False)
    assert (cell.point, cell.low, cell.high) == (np.mean(A), lo, hi)
    assert cell.method == "percentile bootstrap over 22 items (1 seed)"
    diff = iv.difference_interval(a, "live_qa.avg", b, "live_qa.avg")
    lo, hi = scipy_percentile((np.array(A, float), np.array(B, float)), lambda x, y, axis: (x - y).mean(axis),
                              paired=True)
    assert (diff.low, diff.high) == pytest.approx((lo, hi), abs=1e-9)   # the same resamples; float order differs
    assert diff.point == pytest.approx(np.mean(A) - np.mean(B))
    assert diff.method == "percentile bootstrap over 22 paired items (1 seed)" and diff.excludes_zero
    # pairing is by item id, not position: b's items listed in reverse order give the same interval
    b_rev = row("t_b", {"live_qa.avg": [B[::-1]]}, ids=[f"live_qa-{i:05d}" for i in range(22)][::-1])
    assert iv.difference_interval(a, "live_qa.avg", b_rev, "live_qa.avg") == diff


def test_two_suites_of_one_row_are_resampled_independently():
    a = row("t_a", {"live_qa.avg": [A], "variant_qa.avg": [B]})
    diff = iv.difference_interval(a, "live_qa.avg", a, "variant_qa.avg")
    lo, hi = scipy_percentile((np.array(A, float), np.array(B, float)), lambda x, y, axis: x.mean(axis) - y.mean(axis),
                              paired=False)
    assert (diff.low, diff.high) == pytest.approx((lo, hi), abs=1e-9) and diff.method == "percentile bootstrap over 22 and 22 items (1 seed)"


def test_seeds_and_items_rule_by_hand():
    # seeds 10, 20, 30: s^2 / S = 100 / 3; item se 3: 9; total 42.333; nu = 42.333^2 / ((100/3)^2 / 2 + 81 / 20)
    mean, lo, hi = iv.seeds_and_items_interval([10.0, 20.0, 30.0], 3.0, 21)
    total = 100 / 3 + 9
    nu = total ** 2 / ((100 / 3) ** 2 / 2 + 81 / 20)
    assert nu == pytest.approx(3.2024, abs=1e-4)
    assert mean == 20.0 and hi - mean == pytest.approx(stats.t.ppf(0.975, nu) * total ** 0.5, rel=1e-12)
    assert mean - lo == pytest.approx(hi - mean)
    # seeds agree: the t over items (nu = N - 1); items agree: the t over seeds (nu = S - 1)
    _, _, hi = iv.seeds_and_items_interval([5.0, 5.0], 2.0, 31)
    assert hi - 5.0 == pytest.approx(stats.t.ppf(0.975, 30) * 2.0)
    _, _, hi = iv.seeds_and_items_interval([10.0, 20.0, 30.0], 0.0, 31)
    assert hi - 20.0 == pytest.approx(stats.t.ppf(0.975, 2) * 10 / 3 ** 0.5)
    assert iv.seeds_and_items_interval([4.0, 4.0], 0.0, 30) == (4.0, 4.0, 4.0)


def test_several_seeds_use_one_item_resample_for_every_seed():
    seeds_a = [A, A[1:] + A[:1], A[2:] + A[:2]]
    a = row("t_a", {"live_qa.avg": seeds_a}, seeds=(0, 1, 2))
    cell = iv.difference_interval(a, "live_qa.avg")
    values = np.array(seeds_a, float)
    res = stats.bootstrap((np.arange(22),), lambda i, axis: values[:, i].mean(-1).mean(0), vectorized=True,
                          n_resamples=iv.N_RESAMPLES, batch=iv.BOOTSTRAP_BATCH, method="percentile",
                          rng=np.random.default_rng(iv.BOOTSTRAP_SEED))
    expected = iv.seeds_and_items_interval(values.mean(1), res.standard_error, 22)
    assert (cell.point, cell.low, cell.high) == pytest.approx(expected)
    assert cell.method == "t over 3 seeds + bootstrap over 22 items"


def test_without_per_item_scores_the_t_over_seeds_or_no_interval():
    a = row("t_a", {"live_qa.avg": [[60.0] * 20, [62.0] * 20, [67.0] * 20]}, seeds=(0, 1, 2))
    old = {**a, "items": None}
    cell = iv.difference_interval(old, "live_qa.avg")
    # mean 63, s = 3.605551, half = 4.302652729911275 * 3.605551 / sqrt 3 = 8.956686 (test_results' numbers)
    assert (round(cell.low, 4), round(cell.high, 4)) == (54.0433, 71.9567)
    assert cell.method == "t over 3 seeds (t_a keeps no per-item scores of this metric)"
    one = iv.difference_interval({**row("t_a", {"live_qa.avg": [A]}), "items": None}, "live_qa.avg")
    assert one.low is None and not one.excludes_zero
    assert one.method == "no interval: 1 seed, and t_a keeps no per-item scores of this metric"


def test_a_difference_of_two_shares_is_clipped_to_plus_minus_100():
    # Two seeds that disagree widely: the t over 2 seeds (t_0.975,1 = 12.706) would reach far past +-100.
    a = row("c_a", {"live_qa.avg": [[100.0] * 20, [0.0] * 20]}, seeds=(0, 1))
    b = row("c_b", {"live_qa.avg": [[0.0] * 20, [100.0] * 20]}, seeds=(0, 1))
    cell = iv.difference_interval({**a, "items": None}, "live_qa.avg", {**b, "items": None}, "live_qa.avg")
    assert (cell.point, cell.low, cell.high) == (0.0, -100.0, 100.0)
    assert iv.difference_range("avg", "acc") == (-100.0, 100.0)
    assert iv.difference_range("calls_per_ep", "calls_per_ep") == (-np.inf, np.inf)
    assert iv.difference_range("avg", "calls_per_ep") == (-np.inf, 100.0)


def test_refusals_name_the_rows_the_suite_and_the_counts():
    a = row("t_a", {"live_qa.avg": [A]})
    other_ids = row("t_b", {"live_qa.avg": [B]}, ids=[f"live_qa-{i:05d}" for i in range(1, 23)])
    with pytest.raises(ValueError, match=r"t_a and t_b were evaluated on different live_qa items \(22 vs 22; "
                                         r"e\.g\. \['live_qa-00000', 'live_qa-00022'\]\)"):
        iv.difference_interval(a, "live_qa.avg", other_ids, "live_qa.avg")
    with pytest.raises(ValueError, match=r"t_a and t_b used different eval sets \(eval keys e1 and e2"):
        iv.difference_interval(a, "live_qa.avg", row("t_b", {"live_qa.avg": [B]}, eval_key="e2"), "live_qa.avg")
    with pytest.raises(ValueError, match=r"t_a \(seeds \[0\]\) and t_b \(seeds \[0, 1\]\) were run with different seeds"):
        iv.difference_interval(a, "live_qa.avg", row("t_b", {"live_qa.avg": [B, B]}, seeds=(0, 1)), "live_qa.avg")
    with pytest.raises(ValueError, match=r"\(seeds \[0, 1\]\) and t_b \(seeds \[0, 1, 2\]\) were run with different"):
        iv.difference_interval(row("t_a", {"live_qa.avg": [A, A]}, seeds=(0, 1)), "live_qa.avg",
                               row("t_b", {"live_qa.avg": [B, B, B]}, seeds=(0, 1, 2)), "live_qa.avg")
    small = row("t_s", {"live_qa.avg": [A[:19]]})
    with pytest.raises(ValueError, match=r"t_s: live_qa has 19 items; an item bootstrap needs at least 20"):
        iv.difference_interval(small, "live_qa.avg")
    # results.json's intervals fall back to the t over seeds and say why
    intervals, methods = iv.reported_intervals(row("t_s", live([A[:19], B[:19]]), seeds=(0, 1)))
    assert methods == {"live_qa": "t over 2 seeds (the item bootstrap is refused: t_s: live_qa has 19 items; an item "
                                  "bootstrap needs at least 20 (raise eval.world.eval_items / eval.ifeval_mini_items))"}
    assert set(intervals["live_qa"]) == {"acc", "eff", "avg"}


def test_a_non_finite_value_gets_no_interval_and_says_which_cell_and_seed():
    nan_seed = row("t_n", live([A, B]), seeds=(0, 1))
    nan_seed["per_seed"][1]["live_qa"]["avg"] = float("nan")
    with pytest.raises(ValueError, match=r"^t_n Live QA avg: seed 1 is nan; expected a finite number$"):
        iv.difference_interval(nan_seed, "live_qa.avg")
    with pytest.raises(ValueError, match=r"t_n Live QA avg: seed 1 is nan"):
        iv.difference_interval(row("t_b", live([B, A]), seeds=(0, 1)), "live_qa.avg", nan_seed, "live_qa.avg")
    intervals, methods = iv.reported_intervals(nan_seed)
    assert set(intervals["live_qa"]) == {"acc", "eff"}  # no NaN interval is written
    assert "no interval: t_n Live QA avg: seed 1 is nan; expected a finite number (avg)" in methods["live_qa"]
    nan_item = row("t_i", live([A, B]), seeds=(0, 1))
    nan_item["items"]["live_qa"]["scores"]["acc"][0][3] = float("inf")
    with pytest.raises(ValueError, match=r"^t_i Live QA acc: its per-item scores or weights hold a non-finite number$"):
        iv.difference_interval(nan_item, "live_qa.acc")
    intervals, methods = iv.reported_intervals(nan_item)  # the t over seeds, with the reason
    assert set(intervals["live_qa"]) == {"acc", "eff", "avg"} and np.isfinite(intervals["live_qa"]["acc"]).all()
    assert "t over 2 seeds (the item bootstrap is refused: t_i Live QA acc: its per-item scores" in methods["live_qa"]


def test_item_scores_from_the_evaluation_files(tmp_path):
    # two IF-mini prompts: strict [T, F, T] and [T]: prompt_strict (0 + 100) / 2 = 50; inst_strict 3 / 4 = 75
    rows = [{"key": 7, "strict": [True, False, True], "loose": [True, True, True]},
            {"key": 9, "strict": [True], "loose": [True]}]
    (tmp_path / "ifeval_mini.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    live = [{"item": {"item_id": f"live_qa-{i:05d}"}, "scores": {"acc": 100.0 * (i % 2), "eff": 50.0,
                                                                 "avg": 50.0 * (i % 2) + 25.0}} for i in range(3)]
    (tmp_path / "live_qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in live))
    read = iv.read_item_scores(tmp_path)
    assert read["variant_qa"] is None and read["ifeval"] is None
    assert read["ifeval_mini"]["ids"] == ["7", "9"]
    assert read["ifeval_mini"]["scores"]["prompt_strict"] == [0.0, 100.0]
    assert read["ifeval_mini"]["weights"]["inst_strict"] == [3.0, 1.0]
    metrics = {"ifeval_mini": {"prompt_strict": 50.0, "inst_strict": 75.0, "prompt_loose": 100.0, "inst_loose": 100.0},
               "live_qa": {"acc": 100 / 3, "eff": 50.0, "avg": 99.0}}       # avg is not the items' mean
    block = iv.item_block([read], [metrics], "t_a")
    assert block["ifeval_mini"]["scores"]["inst_strict"] == [[pytest.approx(200 / 3, abs=1e-6), 100.0]]
    assert block["ifeval_mini"]["weights"] == {"inst_strict": [[3.0, 1.0]], "inst_loose": [[3.0, 1.0]]}
    assert set(block["live_qa"]["scores"]) == {"acc", "eff"}                   # avg gets the t over seeds instead
    shuffled = {**read, "ifeval_mini": {**read["ifeval_mini"], "ids": ["9", "7"],
                                        "scores": {k: v[::-1] for k, v in read["ifeval_mini"]["scores"].items()},
                                        "weights": {k: v[::-1] for k, v in read["ifeval_mini"]["weights"].items()}}}
    assert iv.item_block([read, shuffled], [metrics, metrics], "t_a")["ifeval_mini"]["scores"]["prompt_strict"] == [
        [0.0, 100.0], [0.0, 100.0]]                                            # aligned to seed 0's order
    other = {**read, "ifeval_mini": {**read["ifeval_mini"], "ids": ["7", "8"]}}
    with pytest.raises(ValueError, match=r"t_a: ifeval_mini of seed index 1 holds other item ids"):
        iv.item_block([read, other], [metrics, metrics], "t_a")


def test_group_table_marks_only_differences_whose_interval_excludes_zero():
    group = load_all()["table5"]
    clear = [100.0] * 11 + [50.0] * 11
    noisy_a, noisy_b = [100.0, 0.0] * 11, [0.0, 100.0] * 11     # mean 50 each: the interval crosses 0
    results = {"table5_rl_original": row("table5_rl_original", {"live_qa.avg": [clear], "prompt_robustness.avg": [noisy_a]}),
               "table5_distill_original": row("table5_distill_original",
                                              {"live_qa.avg": [[50.0] * 11 + [0.0] * 11],
                                               "prompt_robustness.avg": [noisy_b]})}
    table = group_markdown(group, results, "micro")
    line = next(l for l in table.splitlines() if l.startswith("| original env"))
    cells = [c.strip() for c in line.split("|")[2:-1]]
    assert cells[0] == "+50.0 [+50.0, +50.0]* (+0.1)"               # every item +50: excludes 0
    assert cells[3].startswith("+0.0 [") and "*" not in cells[3]       # crosses 0: never marked
    assert "* marks an interval that excludes 0, no other difference is significant" in table
    assert "| HSA env: RL - distillation | - (+0.9) |" in table


def test_results_md_says_how_the_intervals_were_computed():
    experiment = next(r for r in load_all()["table6"].rows if r.name == "table6_both")
    res = row("table6_both", live([A]))
    res["metrics"] = {suite: None for suite in ("variant_qa", "tool_robustness", "prompt_robustness", "ifeval",
                                                "ifeval_mini")} | res["metrics"]
    res["per_seed"] = [res["metrics"]]
    res["intervals"], res["interval_method"] = iv.reported_intervals(res)
    md = experiment_markdown(res, experiment)
    lo, hi = res["intervals"]["live_qa"]["avg"]
    assert f"| Live QA avg | {np.mean(A):.1f} [{lo:.1f}, {hi:.1f}] | 93.3 |" in md
    assert "\n- Live QA: percentile bootstrap over 22 items (1 seed)\n" in md
    old = {k: v for k, v in res.items() if k not in ("items", "intervals", "interval_method")}
    old.update(seeds=[0, 1], per_seed=[res["metrics"], res["metrics"]])
    assert "95% intervals: the t over seeds (this results.json holds no per-item scores)." in experiment_markdown(
        old, experiment)
    # a pooled reading metric (no per-item scores) beside them: each method names its keys
    res["per_seed"][0]["live_qa"]["name_valid"] = 40.0
    assert iv.reported_intervals(res)[1]["live_qa"] == ("percentile bootstrap over 22 items (1 seed) (acc, eff, avg); "
                                                        "no interval: 1 seed, and table6_both keeps no per-item scores of this metric "
                                                        "(name_valid)")


def test_an_old_results_json_gets_its_items_from_the_evaluation_files(tmp_path):
    from hat_jax.experiments.chain import base_key, eval_dir
    from hat_jax.experiments.runner import with_item_intervals
    from hat_jax.experiments.scales import get_scale

    scale = get_scale("micro")
    experiment = next(r for r in load_all()["table3"].rows if r.name == "table3_base")   # empty chain: the base
    lines = [{"item": {"item_id": f"live_qa-{i:05d}"}, "scores": {"acc": a, "eff": a, "avg": a}}
             for i, a in enumerate(map(float, A))]
    for seed in (0, 1):
        out = eval_dir(base_key(scale), seed, scale, tmp_path)
        out.mkdir(parents=True)
        (out / "live_qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    metrics = {"live_qa": {k: float(np.mean(A)) for k in ("acc", "eff", "avg")}, "variant_qa": None}
    old = {"experiment": "table3_base", "seeds": [0, 1], "per_seed": [metrics, metrics]}
    new = with_item_intervals(old, experiment, scale, tmp_path)
    assert new["items"]["live_qa"]["ids"][:2] == ["live_qa-00000", "live_qa-00001"]
    assert new["items"]["variant_qa"] is None and new["eval_key"] == eval_dir(base_key(scale), 0, scale, tmp_path).name
    assert new["interval_method"] == {"live_qa": "t over 2 seeds + bootstrap over 22 items"}
    assert new["intervals"]["live_qa"]["avg"][0] < np.mean(A) < new["intervals"]["live_qa"]["avg"][1]


def test_reading_shares_are_weighted_means_over_items_and_get_the_ratio_bootstrap(tmp_path):
    from hat_jax.judges.reading import EpisodeReading, reading_scores

    # 36 episodes: calls 0-2 (name validity pools calls), fetched defined on the even ones, relayed on 3 only
    readings = [EpisodeReading(calls=i % 3, valid_calls=min(i % 3, i % 2), skill=i % 2, chain=None if i % 4 else 1,
                               fetched=(i // 2) % 2 if i % 2 == 0 else None, relayed=1 if i in (0, 8, 16) else None,
                               abstained=None if i % 2 else int(i % 6 == 0)) for i in range(36)]
    rows = [{"item": {"item_id": f"live_qa-{i:05d}"}, "scores": {"acc": 100.0, "eff": 0.0, "avg": 50.0},
             "reading": dict(r.__dict__)} for i, r in enumerate(readings)]
    (tmp_path / "live_qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    read = iv.read_item_scores(tmp_path)["live_qa"]
    suite = reading_scores(readings)
    assert read["weights"]["name_valid"] == [float(r.calls) for r in readings]
    assert read["weights"]["fact_fetched"] == [1.0 if i % 2 == 0 else 0.0 for i in range(36)]
    assert "calls_per_ep" not in read["weights"] and read["scores"]["calls_per_ep"] == [float(i % 3) for i in range(36)]
    metrics = {"live_qa": {"acc": 100.0, "eff": 0.0, "avg": 50.0, **suite}}
    block = iv.item_block([{"live_qa": read}], [metrics], "t_r")["live_qa"]
    assert set(block["scores"]) == {"acc", "eff", "avg", *suite}                # every share reproduces its metric
    results = {"experiment": "t_r", "seeds": [0], "per_seed": [metrics], "metrics": metrics,
               "items": {"live_qa": block}, "eval_key": "e1"}
    cell = iv.difference_interval(results, "live_qa.name_valid")
    v, w = np.array(block["scores"]["name_valid"][0]), np.array(block["weights"]["name_valid"][0])
    lo, hi = scipy_percentile((v, w), lambda x, y, axis: (x * y).sum(axis) / y.sum(axis), paired=True)
    assert cell.point == pytest.approx(suite["name_valid"]) and (cell.low, cell.high) == pytest.approx((lo, hi))
    assert cell.method == "percentile bootstrap over 36 items (1 seed)"
    # relayed is defined on 3 episodes: no item bootstrap, and with 1 seed no interval, saying why
    few = iv.difference_interval(results, "live_qa.relayed")
    assert few.low is None and few.method == ("no interval: 1 seed, and t_r's relayed is defined on 3 of 36 items in "
                                              "some seed (the others have no gold fact fetched), fewer than the 20 an "
                                              "item bootstrap needs")
    # rows written before the reading counts were stored give no reading scores
    for r in rows:
        del r["reading"]
    (tmp_path / "live_qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert set(iv.read_item_scores(tmp_path)["live_qa"]["scores"]) == {"acc", "eff", "avg"}


def test_reading_records_of_older_or_malformed_formats_give_no_reading_scores(tmp_path):
    # before fetched / relayed / abstained existed (an older evaluation reused by a later row), and malformed counts
    old = {"calls": 2, "valid_calls": 1, "skill": 1, "chain": None}
    for reading, kept in ((old, {"name_valid", "skill_acc", "chain_done", "calls_per_ep"}), ({}, set()),
                          ({**old, "calls": None}, {"skill_acc", "chain_done"}),
                          ({**old, "skill": 2, "fetched": True}, {"name_valid", "chain_done", "calls_per_ep"})):
        rows = [{"item": {"item_id": f"live_qa-{i:05d}"}, "scores": {"acc": 100.0}, "reading": reading}
                for i in range(3)]
        (tmp_path / "live_qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        assert set(iv.read_item_scores(tmp_path)["live_qa"]["scores"]) == {"acc"} | kept, reading
