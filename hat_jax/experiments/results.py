"""results.json and results.md of an experiment, and a group's table beside the paper's.

results.json (every metric on the paper's 0-100 scale but the count "calls_per_ep" and "mtp"):

    {"experiment", "preset", "world_harness" (the harness the world's data and suites are written under), "seeds",
     "wall_s",
     "stages": [{"name", "harness", "steps", "wall_s", ...}],
     "metrics": {"live_qa": {"acc", "eff", "avg", + READING}, "variant_qa": {...},
                 "tool_robustness": {"adr", "rc", "tc", "avg", + READING},
                 "prompt_robustness": {"adr", "llm", "tco", "avg", + READING}, "ifeval": {...}, "ifeval_mini": {...}},
     "per_seed": [{the same metrics for each seed}],
     "mtp": {"acceptance_depth1", "mean_accepted_length", "positions", "episodes", "per_seed": [...]} or null,
     "eval_key": the digest of the eval config (rows with one eval key were scored on the same items),
     "eval_dirs": [each seed's evaluation folder, relative to the output root] (its <suite>.jsonl episodes),
     "items": {suite: {"ids", "scores": {key: [[per-item score] per seed]}, "weights": {...}} or null},
     "intervals": {suite: {key: [low, high]}}, "interval_method": {suite: how, or why there is none},
     ...extra fields (chain, paper, base, eval_wall_s)}

"metrics" holds the mean over seeds; a metric that is null for some seed (IFEval skipped) is null in the mean.
"intervals" is the 95% interval of each metric (`hat_jax.experiments.intervals`: the percentile bootstrap over
the suite's items with 1 seed; with several seeds the t over seeds widened by the item bootstrap's variance;
the t over seeds alone when there are no per-item scores, as in a results.json written before "items"; none
with 1 seed and no per-item scores), clipped to the metric's range (`metric_range`: 0-100, a count's at 0;
with 3 seeds the t-interval of a score near 100 otherwise passes 100); "interval_method" says which, per suite. `aggregate` is the mean with the
t over seeds alone. Means and bounds keep 4 decimals, so that results.md's one decimal rounds the
same value the evaluation log rounds (2 decimals would round 11.646 to 11.65, then to 11.7, against the log's
11.6). A suite that was not run is null: IFEval without its data, or a suite left out with
`--set eval.suites=[...]` or `--set eval.ifeval_mini_items=0`.

READING is the reading metrics of every live-stream suite (`hat_jax.judges.reading`, not the paper's, never in
AVG): "name_valid", "skill_acc", "chain_done", "fact_fetched", "relayed", "abstained" on 0-100, and "calls_per_ep", a
count (>= 0, its interval clipped at 0 only). Each is null where its denominator is empty in some seed (no calls, no
task needing a skill, no task with gold calls or checkable facts, nothing fetched; no interval then; results.md says
why), and absent from a results.json written before they existed or
aggregated from a seed evaluated before (results.md: "not measured"); `check_results` accepts both.

"mtp" (`mtp_summary`) is the MTP head's offline draft acceptance of each seed's final checkpoint
(`hat_jax.eval.runner`, "mtp": teacher-forced, depth 1, on held-out Live QA oracle episodes): a share in [0, 1],
not on the 0-100 scale. Its "acceptance_depth1" and "mean_accepted_length" are means over seeds (6 decimals;
null when some seed was not measured), "positions" and "episodes" the counts summed over the measured seeds, and
"per_seed" one entry per seed {"seed", "checkpoint", the four figures (null when not measured)}. It is null
when no seed was measured (a model without an MTP block, `eval.mtp_items=0`); the reason is in "extra".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from hat_jax.experiments.declarations import KEY_LABELS, METRIC_LABELS, SUITE_KEYS, Experiment, Group
from hat_jax.experiments.intervals import mean_interval, metric_range
from hat_jax.judges.reading import READING_KEYS, UNDEFINED

RESULT_KEYS = ("experiment", "preset", "seeds", "wall_s", "stages", "metrics", "per_seed")
MTP_FIGURES = ("acceptance_depth1", "mean_accepted_length", "positions", "episodes")
# What results.md says of the ratio it does not measure (timings on a shared CPU are noise).
SPEED_SOURCE = ("`python experiments/benchmarks/spec_decode_bench.py --checkpoint {ckpt} --k 1` (JAX: decode tokens/s "
                "with 0 and 1 speculative tokens, on random prompts), or for an export on a GPU "
                "`export/check_vllm.py HF_DIR --mtp 1` (vLLM; export/README.md)")


# results.md's note under a table that shows a reading metric.
READING_NOTE = ("Name validity, skill selection, gold chain done, fact fetched, relayed, abstained and calls / "
                "episode show reading directly (`hat_jax.judges.reading`; not the paper's, not in AVG): name "
                "validity = calls whose tool name, and for a skill load whose skill id, exists in the harness the "
                "episode ran under / all calls; skill selection = episodes whose first loaded skill is the task's, "
                "loaded before any world tool / episodes whose task needs a skill (every generated task does); gold "
                "chain done = episodes that make every gold call in group order / episodes whose task has gold "
                "calls; fact fetched = episodes where an ok world-tool result holds a gold fact / episodes whose "
                "task has a checkable gold fact; relayed = of those that fetched, replies stating every returned "
                "gold fact (RC); abstained = accurate replies that state no gold fact / episodes whose task has one "
                "(Accuracy earned by saying nothing); calls / episode is a count, not on 0-100.")


def metric_value(metrics: Mapping[str, Any], path: str) -> float | None:
    """metrics["suite"]["key"] for path "suite.key"; None when the suite is null or absent, or the key null or
    absent (a reading metric: module docstring)."""
    suite, key = path.split(".")
    block = metrics.get(suite)
    return None if block is None else block.get(key)


def aggregate(per_seed: Sequence[Mapping[str, Any]]) -> tuple[dict, dict]:
    """(mean metrics, 95% intervals clipped to each metric's range, `metric_range`) over seeds, in the results.json
    layout (module docstring): a suite null for some seed is null; a key null for some seed is null, without an
    interval; a key absent from some seed's block (a reading metric evaluated before it existed) is left out."""
    mean, intervals = {}, {}
    for suite, keys in SUITE_KEYS.items():
        blocks = [m.get(suite) for m in per_seed]
        if any(b is None for b in blocks):
            mean[suite] = None
            continue
        mean[suite], intervals[suite] = {}, {}
        for key in keys:
            values = [b[key] for b in blocks if key in b]
            if len(values) < len(blocks):
                continue
            if any(v is None for v in values):
                mean[suite][key] = None
                continue
            m, lo, hi = mean_interval([float(v) for v in values])
            low, high = metric_range(key)
            mean[suite][key] = round(m, 4)
            intervals[suite][key] = [round(max(lo, low), 4), round(min(hi, high), 4)]
    return mean, intervals


def mtp_summary(records: Sequence[Mapping[str, Any]]) -> dict | None:
    """results.json's "mtp" (module docstring) from the seed records ({"seed", "checkpoint", "metrics"}, the
    metrics holding the evaluation's "mtp" figures or null); None when no seed was measured."""
    per_seed = []
    for r in records:
        figures = (r.get("metrics") or {}).get("mtp")
        per_seed.append({"seed": int(r["seed"]), "checkpoint": r.get("checkpoint"),
                         **{k: None if figures is None else figures[k] for k in MTP_FIGURES}})
    measured = [e for e in per_seed if e["acceptance_depth1"] is not None]
    if not measured:
        return None
    complete = len(measured) == len(per_seed)
    mean = lambda k: round(sum(e[k] for e in measured) / len(measured), 6) if complete else None  # noqa: E731
    return {"acceptance_depth1": mean("acceptance_depth1"), "mean_accepted_length": mean("mean_accepted_length"),
            "positions": sum(int(e["positions"]) for e in measured),
            "episodes": sum(int(e["episodes"]) for e in measured), "per_seed": per_seed}


def _check_mtp(block: Any) -> None:
    if block is None:
        return
    if not isinstance(block, Mapping) or (set(MTP_FIGURES) | {"per_seed"}) - set(block):
        raise ValueError(f"results.json: mtp must be null or hold {', '.join(MTP_FIGURES)}, per_seed; got {block!r}")
    for where, entry in [("mtp", block)] + [(f"mtp.per_seed[{i}]", e) for i, e in enumerate(block["per_seed"])]:
        acc, length = entry.get("acceptance_depth1"), entry.get("mean_accepted_length")
        if acc is None:
            continue
        if not isinstance(acc, (int, float)) or not 0 <= acc <= 1:
            raise ValueError(f"results.json: {where}.acceptance_depth1 = {acc!r}; expected a share in [0, 1]")
        if not isinstance(length, (int, float)) or abs(length - 1 - acc) > 1e-5:
            raise ValueError(f"results.json: {where}.mean_accepted_length = {length!r}; expected 1 + acceptance_depth1 "
                             f"= {1 + acc!r}")


def _check_items(items: Any, n_seeds: int) -> None:
    for suite, block in (items or {}).items():
        if block is None:
            continue
        n = len(block["ids"])
        for key, rows in list(block["scores"].items()) + list(block["weights"].items()):
            if len(rows) != n_seeds or any(len(r) != n for r in rows):
                raise ValueError(f"results.json: items.{suite}.{key} must hold {n_seeds} lists (one per seed) of "
                                 f"{n} values (one per id)")


def check_results(data: Mapping[str, Any]) -> None:
    """Raises ValueError naming the first field that does not follow the results.json schema."""
    for key in RESULT_KEYS:
        if key not in data:
            raise ValueError(f"results.json: missing field {key!r}")
    for i, stage in enumerate(data["stages"]):
        for key in ("name", "harness", "steps", "wall_s"):
            if key not in stage:
                raise ValueError(f"results.json: stages[{i}] lacks {key!r}")
        if stage["harness"] not in ("original", "hsa"):
            raise ValueError(f"results.json: stages[{i}].harness = {stage['harness']!r}; expected original|hsa")
    for where, metrics in [("metrics", data["metrics"])] + [(f"per_seed[{i}]", m) for i, m in enumerate(data["per_seed"])]:
        for suite, keys in SUITE_KEYS.items():
            if suite not in metrics:
                raise ValueError(f"results.json: {where} lacks {suite!r}")
            block = metrics[suite]
            if block is None:  # not run: IFEval without data, or a suite left out (eval.suites, ifeval_mini_items=0)
                continue
            required = [k for k in keys if k not in READING_KEYS]  # a reading metric may be absent (or null)
            if not isinstance(block, Mapping) or set(required) - set(block):
                raise ValueError(f"results.json: {where}.{suite} must hold {', '.join(required)}, got {block!r}")
            for key in keys:
                value = block.get(key)
                if value is None and key in READING_KEYS:
                    continue
                low, high = metric_range(key)
                if not isinstance(value, (int, float)) or not low <= value <= high:
                    expected = "a number >= 0" if high == math.inf else f"a number in [{low:.0f}, {high:.0f}]"
                    raise ValueError(f"results.json: {where}.{suite}.{key} = {value!r}; expected {expected}")
    if len(data["per_seed"]) != len(data["seeds"]):
        raise ValueError(f"results.json: {len(data['per_seed'])} per_seed entries for seeds {data['seeds']}")
    _check_items(data.get("items"), len(data["seeds"]))
    _check_mtp(data.get("mtp"))


def _label(path: str) -> str:
    suite, key = path.split(".")
    return f"{METRIC_LABELS[suite]} {KEY_LABELS.get(key, key.replace('_', ' '))}"


def _undefined(results: Mapping[str, Any], suite: str, key: str) -> str:
    """Why a reading metric's mean is null: its empty denominator, and in how many seeds."""
    reason = UNDEFINED.get(key, "undefined")
    seeds = results["per_seed"]
    if len(seeds) < 2:
        return reason
    n = sum((m.get(suite) or {}).get(key, 0) is None for m in seeds)
    return f"{reason} ({n} of {len(seeds)} seeds)"


def _cell(results: Mapping[str, Any], path: str) -> str:
    suite, key = path.split(".")
    block = results["metrics"].get(suite)
    if block is None:
        return "skipped" if suite == "ifeval" else "-"
    if key not in block:
        return "not measured"  # a reading metric of a results.json written before it existed
    value = block[key]
    if value is None:
        return _undefined(results, suite, key)
    interval = (results.get("intervals") or {}).get(suite, {}).get(key)
    if interval and (len(results["seeds"]) > 1 or "interval_method" in results):
        return f"{value:.1f} [{interval[0]:.1f}, {interval[1]:.1f}]"
    return f"{value:.1f}"


def _time_line(results: Mapping[str, Any]) -> str:
    """Where the experiment's time went: the base, its stages, the evaluation (results.json's fields)."""
    base = results.get("base") or {}
    report = base.get("report") or {}
    if base.get("trained"):
        base_text = f"base {report.get('wall_s', base.get('wall_s', 0.0)):.0f} s (pretrained here)"
    elif report.get("wall_s") is not None:  # every phase of a continued base (`chain_wall_s`)
        base_text = f"base cached (pretrained once in {report.get('chain_wall_s', report['wall_s']):.0f} s)"
    else:
        base_text = f"base {base.get('source', 'cached')}"
    stages = sum(s["wall_s"] for s in results["stages"] if not s.get("cached"))
    evals = sum(results.get("eval_wall_s") or [])
    return (f"Wall time {results['wall_s']:.0f} s: {base_text}, stages trained here {stages:.0f} s, evaluation "
            f"{evals:.0f} s (the last command took {results.get('wall_s_this_invocation', results['wall_s']):.0f} s).")


def skip_reason(results: Mapping[str, Any], name: str) -> str | None:
    """Why the evaluation's `name` part ("ifeval", "mtp") was not measured for some seed (its `extra[name]
    ["skipped"]`), or None when it was."""
    for extra in results.get("extra") or []:
        reason = ((extra or {}).get(name) or {}).get("skipped")
        if reason:
            return str(reason)
    return None


def mtp_markdown(results: Mapping[str, Any]) -> list[str]:
    """results.md's "MTP draft acceptance" section (lines): the figures, what they mean, where the speed-up
    comes from."""
    block = results.get("mtp")
    lines = ["## MTP draft acceptance", ""]
    if block is None:
        reason = skip_reason(results, "mtp") or "this results.json predates the measurement"
        return lines + [f"Not measured: {reason}.", ""]
    seeds = block["per_seed"]
    if block["acceptance_depth1"] is None:
        head = "Not measured for every seed (no mean)"
    else:
        head = (f"Depth-1 acceptance {block['acceptance_depth1']:.4f}, mean accepted length "
                f"{block['mean_accepted_length']:.4f}" + (f" (mean over {len(seeds)} seeds)" if len(seeds) > 1 else ""))
    lines.append(f"{head}; {block['positions']} positions in {block['episodes']} held-out Live QA oracle episodes.")
    if len(seeds) > 1:
        lines += [""] + [f"- seed {e['seed']}: " + ("not measured" if e["acceptance_depth1"] is None else
                                                    f"{e['acceptance_depth1']:.4f} ({e['positions']} positions)")
                         for e in seeds]
    lines += ["", "The share of positions where the MTP head's greedy draft equals the main model's greedy next "
              "token, teacher-forced at depth 1 (`hat_jax.eval.mtp_acceptance`); with 1 speculative token the mean "
              "accepted length (tokens per verifying forward) is 1 + acceptance. The decode speed-up with MTP on "
              f"vs off is not timed here: {SPEED_SOURCE.format(ckpt=seeds[0]['checkpoint'] or 'CKPT')}.", ""]
    return lines


def interval_lines(results: Mapping[str, Any]) -> list[str]:
    """How results.md's intervals were computed, per suite (results.json's "interval_method")."""
    methods = results.get("interval_method")
    if methods:
        return ["", "95% intervals (`hat_jax.experiments.intervals`; docs/results.md):", ""] + [
            f"- {METRIC_LABELS[suite]}: {how}" for suite, how in methods.items()]
    if len(results["seeds"]) > 1:
        return ["", "95% intervals: the t over seeds (this results.json holds no per-item scores)."]
    return []


def difference_cell(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None, path: str,
                    notes: dict[str, int]) -> str:
    """One cell of a difference row: "+d [low, high]", with "*" only when the interval excludes 0; a cell with no
    interval or a refused one gets a numbered note (`notes`: text -> number, filled here)."""
    if a is None or b is None or metric_value(a["metrics"], path) is None or metric_value(b["metrics"], path) is None:
        return "-"
    from hat_jax.experiments.intervals import difference_interval

    try:
        iv = difference_interval(a, path, b, path)
    except ValueError as err:
        d = metric_value(a["metrics"], path) - metric_value(b["metrics"], path)
        note = notes.setdefault(f"no interval: {err}", len(notes) + 1)
        return f"{d:+.1f} (note {note})"
    if iv.low is None:
        return f"{iv.point:+.1f} (note {notes.setdefault(iv.method, len(notes) + 1)})"
    return f"{iv.point:+.1f} [{iv.low:+.1f}, {iv.high:+.1f}]" + ("*" if iv.excludes_zero else "")


def experiment_markdown(results: Mapping[str, Any], experiment: Experiment) -> str:
    """results.md: the chain, the stages' wall time, and every metric beside the paper's number."""
    seeds = results["seeds"]
    lines = [f"# {experiment.name} ({results['preset']})", "", experiment.description, "",
             f"Chain: base -> {' -> '.join(str(s) for s in experiment.chain) or '(none: the base itself)'}; "
             f"seeds {', '.join(map(str, seeds))}; world harness {results.get('world_harness', 'production')}.", "",
             _time_line(results), ""]
    if results["stages"]:
        lines += ["| stage | harness | steps | wall s (all seeds) | trained |", "|---|---|---|---|---|"]
        lines += [f"| {s['name']} | {s['harness']} | {s['steps']} | {s['wall_s']:.0f} | "
                  f"{'reused (another experiment trained it)' if s.get('cached') else 'here'} |"
                  for s in results["stages"]]
        lines.append("")
    shown = len(seeds) > 1 or "interval_method" in results
    interval = (" (mean [95% CI])" if len(seeds) > 1 else " [95% CI]") if shown else ""
    lines += [f"| metric | ours{interval} | paper |", "|---|---|---|"]
    for suite, keys in SUITE_KEYS.items():
        for key in keys:
            path = f"{suite}.{key}"
            paper = experiment.paper.get(path)
            lines.append(f"| {_label(path)} | {_cell(results, path)} | {'' if paper is None else f'{paper:.1f}'} |")
    lines += interval_lines(results)
    skipped = skip_reason(results, "ifeval")
    if skipped:
        lines += ["", f"IFEval skipped: {skipped}."]
    lines += ["", READING_NOTE]
    lines += ["", "Paper: Qwen3.6-35B-A3B on the report's private sets (arXiv 2608.15763); ours: the simulator's "
              "held-out suites at this preset's scale. IF-mini is the in-domain IFEval-style gauge (no paper number).",
              ""]
    lines += mtp_markdown(results)
    return "\n".join(lines).rstrip("\n") + "\n"


def group_markdown(group: Group, results: Mapping[str, Mapping[str, Any]], preset: str) -> str:
    """A group's table: one row per experiment, each column "ours (paper)"; Table 5's differences below."""
    header = "| row | " + " | ".join(_label(c) for c in group.columns) + " |"
    harnesses = sorted({res.get("world_harness", "production") for res in results.values() if res})
    lines = [f"## {group.title} ({preset})", "", f"Cells: ours (paper). World harness: {', '.join(harnesses) or '-'}.",
             "", header,
             "|---|" + "---|" * len(group.columns)]
    for row in group.rows:
        res = results.get(row.name)
        cells = []
        for c in group.columns:
            ours = _cell(res, c) if res else "not run"
            paper = row.paper.get(c)
            cells.append(ours + (f" ({paper:.1f})" if paper is not None else ""))
        lines.append(f"| {row.name} | " + " | ".join(cells) + " |")
    notes: dict[str, int] = {}
    for diff in group.differences:
        a, b = results.get(diff["minuend"]), results.get(diff["subtrahend"])
        parts = []
        for c in group.columns:
            paper = diff["paper"].get(c)
            parts.append(difference_cell(a, b, c, notes) + (f" ({paper:+.1f})" if paper is not None else ""))
        lines.append(f"| {diff['name']} | " + " | ".join(parts) + " |")
    if group.differences:
        lines += ["", "Differences: minuend - subtrahend [95% interval, paired by seed and item; "
                  "`hat_jax.experiments.intervals`]; * marks an interval that excludes 0, no other difference is "
                  "significant."]
        lines += [""] + [f"- note {n}: {text}." for text, n in notes.items()] if notes else []
    if any(c.split(".")[1] in READING_KEYS for c in group.columns):
        lines += ["", READING_NOTE]
    reasons = {skip_reason(res, "ifeval") for res in results.values() if res} - {None}
    if reasons and any(c.startswith("ifeval.") for c in group.columns):
        lines += ["", f"IFEval skipped: {sorted(reasons)[0]}."]
    return "\n".join(lines) + "\n"
