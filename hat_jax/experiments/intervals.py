"""95% intervals of a row's metrics and of differences between cells, from per-item scores and seeds.

A cell is (row, metric path), e.g. ("table3_hat", "variant_qa.avg"). Its value is the mean over seeds of the
seed's suite metric; every metric of `SUITE_KEYS` is a mean over the suite's items of a per-item score (0-100),
weighted for IFEval's instruction-level keys (a prompt weighs its number of instructions, the official
`inst_*` ratio) and for the reading shares (`hat_jax.judges.reading`: name validity weighs an episode by its
calls, the others by 1 where the share is defined and 0 elsewhere, so the weighted mean is the ratio and its
bootstrap the ratio's; such a metric defined on fewer than `MIN_ITEMS` items gets the t over seeds alone, or no
interval with 1 seed). Two sources of noise: which items the eval set drew (the same items in every seed: the eval
set is a function of the eval config, not of the seed) and which training seed ran.

The interval (rule of this module; `Interval.method` names the branch taken):
- 1 seed: the percentile bootstrap over items (Efron & Tibshirani 1993, An Introduction to the Bootstrap,
  ch. 13; `scipy.stats.bootstrap`, method "percentile", `N_RESAMPLES` resamples, fixed `BOOTSTRAP_SEED`).
- S >= 2 seeds: mean +- t_{0.975, nu} * sqrt(s^2 / S + se_items^2), s^2 the sample variance of the S seed
  values, se_items the bootstrap standard error over items (one item resample applied to every seed, so the
  statistic is the mean over seeds), nu the Welch-Satterthwaite degrees of freedom
  (s^2/S + se^2)^2 / ((s^2/S)^2 / (S - 1) + se^4 / (N - 1)) (Satterthwaite 1946). Seeds and items are crossed
  random effects (every seed scores every item); the variance of the grand mean is sigma_seed^2 / S +
  sigma_item^2 / N + sigma_resid^2 / (S N) (Owen 2007, "The pigeonhole bootstrap", Ann. Appl. Stat. 1(2)), and
  the sum of the two estimates counts the residual term twice: conservative, as Owen's bootstrap. It is the t
  over seeds when items add nothing, and about the t over items when seeds agree.
- No per-item scores (a results.json written before they were stored, or a metric that is not a mean of its
  items' scores): the t-interval over seeds (`results.mean_interval`) with S >= 2; no interval with 1 seed.
A difference of two cells: paired by seed (the rows must have the same seeds) and, within one suite, by item
(the same item ids; the paired bootstrap resamples items jointly, Koehn 2004, "Statistical Significance Tests
for Machine Translation Evaluation"); two different suites (Variant QA vs the same row's Live QA) hold different
items, resampled independently. Metric intervals are clipped to the metric's range (`metric_range`), differences
to the range a difference of the two metrics can take (`difference_range`: [-100, 100] for two 0-100 metrics).

Refusals (ValueError, naming the rows, the suite and the counts): fewer than `MIN_ITEMS` items in a suite (the
percentile interval of a mean is too narrow on small samples: with n items its spread shrinks by
sqrt((n - 1) / n) and it uses normal, not t, tails; Hesterberg 2015, "What Teachers Should Know About the
Bootstrap", The American Statistician 69(4), section 3); two rows evaluated with different eval configs
("eval_key") or on different item ids of a suite; rows with different seeds.

results.json's "items" (`item_block`): {suite: {"ids": [N item ids], "scores": {key: [[N values] per seed]},
"weights": {key: [[N weights] per seed]} (IFEval's inst_* keys only)} or null}.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hat_jax.experiments.declarations import IF_KEYS, METRIC_LABELS, SUITE_KEYS
from hat_jax.judges.reading import COUNT_KEYS, RATIO_TERMS, UNDEFINED_ITEM

CONFIDENCE = 0.95
MIN_ITEMS = 20
N_RESAMPLES = 9999
BOOTSTRAP_SEED = 0
BOOTSTRAP_BATCH = 1000   # resamples per vectorised call of the statistic (bounds memory at 978 items)
_TOLERANCE = 1e-3      # per-item scores must reproduce the suite metric within this (0-100 scale)


@dataclasses.dataclass(frozen=True)
class Interval:
    """A point estimate and its 95% interval (low/high None: no interval); `method` says how (module docstring)."""

    point: float
    low: float | None
    high: float | None
    method: str

    @property
    def excludes_zero(self) -> bool:
        """Whether the interval lies on one side of 0 (False without an interval)."""
        return self.low is not None and (self.low > 0 or self.high < 0)


# ---- per-item scores from an evaluation's out_dir (`hat_jax.eval.runner`) ----

def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _instruction_rows(rows: Sequence[Mapping[str, Any]]) -> dict:
    """ifeval(_mini).jsonl rows -> ids, per-item scores of IF_KEYS and the inst_* weights (instructions)."""
    scores, weights = {k: [] for k in IF_KEYS}, {k: [] for k in IF_KEYS if k.startswith("inst_")}
    for row in rows:
        for mode in ("strict", "loose"):
            verdicts = row[mode]
            scores[f"prompt_{mode}"].append(100.0 * all(verdicts))
            scores[f"inst_{mode}"].append(100.0 * sum(verdicts) / len(verdicts))
            weights[f"inst_{mode}"].append(float(len(verdicts)))
    return {"ids": [str(r["key"]) for r in rows], "scores": scores, "weights": weights}


_COUNT_FIELDS = ("calls", "valid_calls")   # ints >= 0; the other fields 0, 1 or None


def _field_ok(reading: Any, field: str) -> bool:
    """Whether a record's `reading` holds `field` as `hat_jax.judges.reading.EpisodeReading` writes it."""
    if not isinstance(reading, Mapping) or field not in reading:
        return False
    value = reading[field]
    if field in _COUNT_FIELDS:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value in (0, 1))


def _live_rows(suite: str, rows: Sequence[Mapping[str, Any]]) -> dict:
    """<suite>.jsonl rows -> ids, the per-item score of every key of the suite that each row holds, and for the
    reading metrics (`reading.RATIO_TERMS`, from each row's "reading" counts) the weights that make their suite value
    a weighted mean over items. A reading metric is left out (no item scores: the t over seeds, `item_block`)
    unless every row holds its fields as the judge writes them; rows written before "reading", or before
    fetched / relayed / abstained existed, give none of those."""
    keys = [k for k in SUITE_KEYS[suite] if all(k in r["scores"] for r in rows)]
    out = {"ids": [str(r["item"]["item_id"]) for r in rows],
           "scores": {k: [float(r["scores"][k]) for r in rows] for k in keys}, "weights": {}}
    for key, (fields, terms) in RATIO_TERMS.items():
        if key in SUITE_KEYS[suite] and all(_field_ok(r.get("reading"), f) for r in rows for f in fields):
            pairs = [terms(r["reading"]) for r in rows]
            out["scores"][key] = [n / d if d else 0.0 for n, d in pairs]
            if key not in COUNT_KEYS:
                out["weights"][key] = [d for _, d in pairs]
    return out


def read_item_scores(eval_dir: str | Path) -> dict[str, dict | None]:
    """{suite: {"ids", "scores": {key: [N]}, "weights": {key: [N]}} or None (no file)} for every suite of
    SUITE_KEYS, from the `<suite>.jsonl` files an evaluation wrote (`hat_jax.eval.runner.evaluate`, out_dir)."""
    out: dict[str, dict | None] = {}
    for suite in SUITE_KEYS:
        path = Path(eval_dir) / f"{suite}.jsonl"
        rows = _read_jsonl(path) if path.is_file() else []
        if not rows:
            out[suite] = None
        else:
            out[suite] = _instruction_rows(rows) if set(SUITE_KEYS[suite]) == set(IF_KEYS) else _live_rows(suite, rows)
    return out


def _weighted_mean(values: Sequence[float], weights: Sequence[float] | None) -> float:
    if weights is None:
        return float(np.mean(values))
    return float(np.dot(values, weights) / np.sum(weights))


def item_block(per_seed_items: Sequence[Mapping[str, Any]], per_seed_metrics: Sequence[Mapping[str, Any]],
               row: str) -> dict[str, dict | None]:
    """results.json's "items" (module docstring) from each seed's `read_item_scores`, aligned to seed 0's order.

    A suite is null when some seed has no per-item file; a key is left out when its per-item (weighted) mean does
    not reproduce the seed's metric (a metric that is not a mean over items gets the t over seeds instead).

    Raises:
      ValueError: two seeds of `row` evaluated on different item ids of a suite (names the row, suite and seeds).
    """
    out: dict[str, dict | None] = {}
    for suite, keys in SUITE_KEYS.items():
        blocks = [items.get(suite) for items in per_seed_items]
        if not blocks or any(b is None for b in blocks) or any(m.get(suite) is None for m in per_seed_metrics):
            out[suite] = None
            continue
        ids = blocks[0]["ids"]
        orders = []
        for seed, block in enumerate(blocks):
            if sorted(block["ids"]) != sorted(ids) or len(set(ids)) != len(ids):
                raise ValueError(f"{row}: {suite} of seed index {seed} holds other item ids than seed index 0 "
                                 f"({len(block['ids'])} vs {len(ids)} items); one row's seeds must share the eval set")
            where = {item: i for i, item in enumerate(block["ids"])}
            orders.append([where[item] for item in ids])
        scores, weights = {}, {}
        for key in keys:
            if not all(key in b["scores"] for b in blocks) or any(m[suite].get(key) is None for m in per_seed_metrics):
                continue
            vals = [[b["scores"][key][i] for i in order] for b, order in zip(blocks, orders)]
            wts = ([[b["weights"][key][i] for i in order] for b, order in zip(blocks, orders)]
                   if key in blocks[0]["weights"] else None)
            if all(abs(_weighted_mean(v, None if wts is None else wts[s]) - float(m[suite][key])) <= _TOLERANCE
                   for s, (v, m) in enumerate(zip(vals, per_seed_metrics))):
                scores[key] = [[round(x, 6) for x in v] for v in vals]
                if wts is not None:
                    weights[key] = wts
        out[suite] = {"ids": list(ids), "scores": scores, "weights": weights}
    return out


# ---- the estimators ----

def bootstrap(statistic: Callable[..., np.ndarray], sizes: Sequence[int],
              confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(low, high, standard error) of the percentile bootstrap over item indices.

    Args:
      statistic: f(*index_arrays) -> [B] for index arrays [B, n_j] (vectorised, `scipy.stats.bootstrap`).
      sizes: the item count of each independently resampled item set: (N,) one set (a paired comparison
        resamples one set of indices for both rows), (N_a, N_b) two suites.
    """
    from scipy import stats

    res = stats.bootstrap(tuple(np.arange(n) for n in sizes), lambda *idx, axis=-1: statistic(*idx),
                          vectorized=True, paired=False, n_resamples=N_RESAMPLES, batch=BOOTSTRAP_BATCH,
                          confidence_level=confidence, method="percentile",
                          rng=np.random.default_rng(BOOTSTRAP_SEED))
    return float(res.confidence_interval.low), float(res.confidence_interval.high), float(res.standard_error)


def seeds_and_items_interval(seed_values: Sequence[float], item_se: float, n_items: int,
                             confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(mean, low, high): mean of `seed_values` +- t_nu * sqrt(s^2/S + item_se^2), nu Welch-Satterthwaite
    (module docstring). Needs S >= 2 seeds and n_items >= 2."""
    from scipy import stats

    s = len(seed_values)
    mean = float(np.mean(seed_values))
    seed_var = float(np.var(seed_values, ddof=1)) / s
    item_var = item_se ** 2
    total = seed_var + item_var
    if total == 0.0:
        return mean, mean, mean
    nu = total ** 2 / (seed_var ** 2 / (s - 1) + item_var ** 2 / (n_items - 1))
    half = float(stats.t.ppf((1 + confidence) / 2, nu)) * math.sqrt(total)
    return mean, mean - half, mean + half


def mean_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the t-interval of the mean of `values` (low = high = mean for one value).

    Source: the Student-t confidence interval, mean +- t_{(1+c)/2, n-1} * s / sqrt(n), s the sample std.
    """
    from scipy import stats

    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, mean, mean
    s = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = float(stats.t.ppf((1 + confidence) / 2, n - 1)) * s / math.sqrt(n)
    return mean, mean - half, mean + half


# ---- cells and differences of results.json dicts ----

def _cell_name(results: Mapping[str, Any], path: str) -> str:
    suite, key = path.split(".")
    return f"{results['experiment']} {METRIC_LABELS[suite]} {key}"


def metric_range(key: str) -> tuple[float, float]:
    """(low, high) of a results.json metric key: [0, inf) for a count (`COUNT_KEYS`), else the 0-100 scale."""
    return (0.0, math.inf) if key in COUNT_KEYS else (0.0, 100.0)


def difference_range(key_a: str, key_b: str) -> tuple[float, float]:
    """(low, high) that a metric `key_a` minus a metric `key_b` can take: [-100, 100] for two 0-100 metrics,
    unbounded where either is a count."""
    (low_a, high_a), (low_b, high_b) = metric_range(key_a), metric_range(key_b)
    return low_a - high_b, high_a - low_b


def measured(results: Mapping[str, Any], path: str) -> bool:
    """Whether every seed has a number for the cell (a suite not run, a reading metric with an empty
    denominator or written before it existed has none)."""
    suite, key = path.split(".")
    return all((m.get(suite) or {}).get(key) is not None for m in results["per_seed"])


def _seed_values(results: Mapping[str, Any], path: str) -> list[float]:
    if not measured(results, path):
        raise ValueError(f"{_cell_name(results, path)}: not measured for every seed")
    suite, key = path.split(".")
    values = [float(m[suite][key]) for m in results["per_seed"]]
    bad = [(seed, v) for seed, v in zip(results["seeds"], values) if not np.isfinite(v)]
    if bad:  # a hand-edited or corrupted results.json: no interval rather than a NaN one
        raise ValueError(f"{_cell_name(results, path)}: seed {bad[0][0]} is {bad[0][1]}; expected a finite number")
    return values


def _item_matrix(results: Mapping[str, Any], path: str) -> tuple[list[str], np.ndarray, np.ndarray] | str | None:
    """(ids, values [S, N], weights [S, N]) of a cell; None without per-item scores; a reason (str) when a
    weighted metric has fewer than MIN_ITEMS items of positive weight in some seed (e.g. relayed over 3 episodes
    that fetched a fact: the resamples would often hold none).

    Raises:
      ValueError: fewer than MIN_ITEMS items (names the row, the suite and the count).
    """
    suite, key = path.split(".")
    block = (results.get("items") or {}).get(suite)
    if not block or key not in block["scores"]:
        return None
    n = len(block["ids"])
    if n < MIN_ITEMS:
        raise ValueError(f"{results['experiment']}: {suite} has {n} items; an item bootstrap needs at least "
                         f"{MIN_ITEMS} (raise eval.world.eval_items / eval.ifeval_mini_items)")
    values = np.asarray(block["scores"][key], dtype=np.float64)
    weights = np.asarray(block["weights"][key], dtype=np.float64) if key in block["weights"] else np.ones_like(values)
    if not (np.isfinite(values).all() and np.isfinite(weights).all()):
        raise ValueError(f"{_cell_name(results, path)}: its per-item scores or weights hold a non-finite number")
    defined = int((weights > 0).sum(-1).min())
    if defined < MIN_ITEMS:
        return (f"{results['experiment']}'s {key} is defined on {defined} of {n} items in some seed (the others have "
                f"no {UNDEFINED_ITEM.get(key, 'weight')}), fewer than the {MIN_ITEMS} an item bootstrap needs")
    return list(block["ids"]), values, weights


def _means(values: np.ndarray, weights: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """[S, B]: each seed's weighted mean over the resampled items idx [B, N]."""
    v, w = values[:, idx], weights[:, idx]
    return (v * w).sum(-1) / w.sum(-1)


def _check_pair(a: Mapping[str, Any], b: Mapping[str, Any]) -> None:
    if list(a["seeds"]) != list(b["seeds"]):
        raise ValueError(f"{a['experiment']} (seeds {a['seeds']}) and {b['experiment']} (seeds {b['seeds']}) were "
                         "run with different seeds; a paired difference needs the same seeds")
    ka, kb = a.get("eval_key"), b.get("eval_key")
    if ka != kb and ka is not None and kb is not None:
        raise ValueError(f"{a['experiment']} and {b['experiment']} used different eval sets (eval keys {ka} and "
                         f"{kb}: another eval config); rerun them with the same preset and --set eval.*")


def _aligned(a: Mapping[str, Any], b: Mapping[str, Any], suite: str, ids_a: list[str], ids_b: list[str]) -> list[int]:
    """Indices into b's items in a's order; refuses different item sets."""
    if sorted(ids_a) != sorted(ids_b):
        only = sorted(set(ids_a) ^ set(ids_b))
        raise ValueError(f"{a['experiment']} and {b['experiment']} were evaluated on different {suite} items "
                         f"({len(ids_a)} vs {len(ids_b)}; e.g. {only[:3]}): one eval set is needed to pair them")
    where = {item: i for i, item in enumerate(ids_b)}
    return [where[item] for item in ids_a]


def seeds_only_interval(seed_values: Sequence[float], clip: tuple[float, float], why: str,
                        confidence: float = CONFIDENCE) -> Interval:
    """The t over seeds alone (`mean_interval`), clipped; no interval with 1 seed. `why`: why not the items."""
    mean, lo, hi = mean_interval(list(seed_values), confidence)
    if len(seed_values) < 2:
        return Interval(mean, None, None, f"no interval: 1 seed, and {why}")
    return Interval(mean, max(lo, clip[0]), min(hi, clip[1]), f"t over {len(seed_values)} seeds ({why})")


def difference_interval(a: Mapping[str, Any], path_a: str, b: Mapping[str, Any] | None = None,
                        path_b: str | None = None, confidence: float = CONFIDENCE) -> Interval:
    """The cell (a, path_a) minus the cell (b, path_b) (b None: the cell itself), with its interval (module
    docstring). `a`, `b`: results.json dicts ("experiment", "seeds", "per_seed", optional "items", "eval_key").

    Raises:
      ValueError: see the module docstring's refusals; a cell not measured for every seed.
    """
    if b is not None:
        _check_pair(a, b)
    seed_diffs = np.asarray(_seed_values(a, path_a)) - (np.asarray(_seed_values(b, path_b)) if b is not None else 0.0)
    point = float(np.mean(seed_diffs))
    key_a = path_a.split(".")[1]
    lo_clip, hi_clip = metric_range(key_a) if b is None else difference_range(key_a, path_b.split(".")[1])
    s = len(seed_diffs)
    ma = _item_matrix(a, path_a)
    mb = _item_matrix(b, path_b) if b is not None else None
    if ma is None or (b is not None and mb is None):
        missing = a["experiment"] if ma is None else b["experiment"]
        return seeds_only_interval(list(seed_diffs), (lo_clip, hi_clip),
                                   f"{missing} keeps no per-item scores of this metric", confidence)
    few = next((m for m in (ma, mb) if isinstance(m, str)), None)
    if few is not None:
        return seeds_only_interval(list(seed_diffs), (lo_clip, hi_clip), few, confidence)
    ids_a, va, wa = ma
    if mb is None:
        stat, sizes = (lambda i: _means(va, wa, i).mean(0)), (len(ids_a),)
        items = f"{len(ids_a)} items"
    elif path_a.split(".")[0] == path_b.split(".")[0]:
        ids_b, vb, wb = mb
        order = _aligned(a, b, path_a.split(".")[0], ids_a, ids_b)
        vb, wb = vb[:, order], wb[:, order]
        stat, sizes = (lambda i: (_means(va, wa, i) - _means(vb, wb, i)).mean(0)), (len(ids_a),)
        items = f"{len(ids_a)} paired items"
    else:
        ids_b, vb, wb = mb
        stat, sizes = (lambda i, j: (_means(va, wa, i) - _means(vb, wb, j)).mean(0)), (len(ids_a), len(ids_b))
        items = f"{len(ids_a)} and {len(ids_b)} items"
    lo, hi, se = bootstrap(stat, sizes, confidence)
    if s == 1:
        method = f"percentile bootstrap over {items} (1 seed)"
    else:
        _, lo, hi = seeds_and_items_interval(list(seed_diffs), se, min(sizes), confidence)
        method = f"t over {s} seeds + bootstrap over {items}"
    return Interval(point, max(lo, lo_clip), min(hi, hi_clip), method)


def reported_intervals(results: Mapping[str, Any]) -> tuple[dict, dict]:
    """results.json's ("intervals", "interval_method"): {suite: {key: [low, high]}} (4 decimals; a metric with no
    interval left out) and {suite: the method, or why there is none, each followed by its keys when the suite's
    keys differ}; null suites are left out of both."""
    intervals: dict[str, dict] = {}
    methods: dict[str, str] = {}
    for suite, keys in SUITE_KEYS.items():
        if any(m.get(suite) is None for m in results["per_seed"]):
            continue
        intervals[suite], seen = {}, {}
        for key in keys:
            if not measured(results, f"{suite}.{key}"):
                continue
            try:
                iv = difference_interval(results, f"{suite}.{key}")
            except ValueError as err:  # too few items: the t over seeds alone, with the reason
                try:
                    iv = seeds_only_interval(_seed_values(results, f"{suite}.{key}"), metric_range(key),
                                             f"the item bootstrap is refused: {err}")
                except ValueError as bad:  # a non-finite seed value: no interval, and why
                    iv = Interval(float("nan"), None, None, f"no interval: {bad}")
            if iv.low is not None:
                intervals[suite][key] = [round(iv.low, 4), round(iv.high, 4)]
            seen.setdefault(iv.method, []).append(key)
        methods[suite] = next(iter(seen)) if len(seen) == 1 else "; ".join(
            f"{how} ({', '.join(which)})" for how, which in seen.items())
    return intervals, methods
