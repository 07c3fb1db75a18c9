"""One experiment (a table row) end to end: its chain for every seed, the evaluation, results.json / results.md.

Outputs in `DIR/<experiment>/`:
- `run_config.json`: what the run is (experiment, preset, seeds, chain, every config of the scale). `--resume`
  on a directory whose run_config differs refuses and lists the differing fields; without `--resume` an
  existing run directory is refused (nothing is overwritten), unless no seed of it finished (a failed start).
- `seed<k>.json`: that seed's stages and metrics (written as soon as the seed is done, so a resumed run
  redoes nothing that finished); `eval/seed<k>/`: the metrics as TensorBoard scalars `eval/<suite>/<key>` at
  the chain's total step count, so `tensorboard --logdir DIR` shows every row of a table side by side
  (stage curves live in `DIR/stages/<chain>-<key>/seed<k>`, `hat_jax.experiments.chain`).
- `stages/`: `<i>-<stage>.json` pointers to the stage run dirs (checkpoints) of seed 0, one per stage.
- `results.json`, `results.md` (`hat_jax.experiments.results`; "mtp": the MTP draft acceptance the evaluation
  measured on each seed's final checkpoint, `hat_jax.eval.runner`; "items", "intervals": the per-item scores
  read from each seed's `DIR/evals/.../<suite>.jsonl` and the 95% intervals, `hat_jax.experiments.intervals`). Their `wall_s` is the time this experiment
  spent over all its invocations (stages it trained, the base when it pretrained it, the evaluations; stages
  reused from another experiment count 0); `wall_s_this_invocation` is the last command's.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hat_jax.experiments.chain import (base_key, chain_keys, eval_dir, eval_key, evaluate_cached, run_chain,
                                      stage_template, write_json_atomic)
from hat_jax.experiments.declarations import SUITE_KEYS, Experiment
from hat_jax.experiments.intervals import item_block, read_item_scores, reported_intervals
from hat_jax.experiments.results import aggregate, check_results, experiment_markdown, mtp_summary
from hat_jax.experiments.scales import Scale, describe
from hat_jax.train.distributed import is_primary

log = logging.getLogger(__name__)


class RunConfigMismatchError(ValueError):
    """`--resume` on a run directory made by another configuration."""


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, Mapping):
        out = {}
        for k, v in data.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: data}


def _failed_start(exp_dir: Path) -> bool:
    """Whether `exp_dir` holds a run_config.json but no finished seed and no results.json."""
    return ((exp_dir / "run_config.json").is_file() and not (exp_dir / "results.json").is_file()
            and not any(exp_dir.glob("seed*.json")))


def check_run_dir(exp_dir: Path, run_config: Mapping[str, Any], resume: bool) -> None:
    """Refuses an existing run dir without resume, or one from another configuration with resume.

    A run dir that holds no finished seed (`seed<k>.json`) and no results.json is a start that failed before
    any seed finished (a missing base folder, a stage error): it is taken over, whatever its configuration, as
    nothing in it could mix with the new run (stage checkpoints live under DIR/stages, keyed by their config).

    Raises:
      FileExistsError: `exp_dir/run_config.json` exists, some seed finished, and resume is False.
      RunConfigMismatchError: resume, but the stored run_config differs (the message lists up to 8 fields).
    """
    path = exp_dir / "run_config.json"
    if not path.is_file():
        return
    if _failed_start(exp_dir):
        return
    if not resume:
        raise FileExistsError(f"{str(exp_dir)!r} already holds a run of {run_config['experiment']}; pass --resume "
                              f"to continue it, or choose another --out")
    stored = json.loads(path.read_text())
    a, b = _flat(stored), _flat(json.loads(json.dumps(run_config, default=str)))
    diff = [f"{k}: stored {a.get(k)!r} != now {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    if diff:
        raise RunConfigMismatchError(f"--resume: {str(exp_dir)!r} was run with another configuration, so its results "
                                     f"would mix two experiments; differing: " + "; ".join(diff[:8])
                                     + (f" (+{len(diff) - 8} more)" if len(diff) > 8 else "")
                                     + ". Rerun with the original --preset/--seeds/--set, or use another --out")


def run_config_for(experiment: Experiment, scale: Scale, seeds: Sequence[int]) -> dict:
    """What `run_config.json` of `experiment` holds for this scale and seeds (compared by `--resume`)."""
    return {"experiment": experiment.name, "preset": scale.name, "seeds": [int(s) for s in seeds],
            "chain": [str(s) for s in experiment.chain], "scale": scale.to_json()}


def check_run_dirs(experiments: Sequence[Experiment], scale: Scale, seeds: Sequence[int], out_root: str | Path,
                   resume: bool) -> None:
    """`check_run_dir` for every experiment of a group, and every stage config of their chains resolved, before
    any of them trains (a refused last row must not surface after the others' hours of training).

    Raises:
      as `check_run_dir`; ValueError: a stage override this scale refuses (names the experiment and the stage).
    """
    for experiment in experiments:
        for spec in experiment.chain:
            try:
                stage_template(scale, spec)
            except ValueError as err:
                raise ValueError(f"{experiment.name}: {err}") from None
        check_run_dir(Path(out_root).resolve() / experiment.name, run_config_for(experiment, scale, seeds), resume)


def _seed_wall(record: Mapping[str, Any]) -> float:
    """Seconds this experiment spent on one seed: the stages it trained (each from the invocation that
    finished it), the base when it pretrained (its report's time) or imported it, and the evaluation."""
    stages = sum(s["wall_s"] for s in record["stages"] if not s.get("cached"))
    base = record["base"]
    base_s = (base.get("report") or {}).get("wall_s", base["wall_s"]) if base.get("trained") else 0.0
    return round(stages + base_s + record["eval_wall_s"], 3)


def _metrics_only(metrics: Mapping[str, Any]) -> dict:
    return {suite: metrics.get(suite) for suite in SUITE_KEYS}


def _log_eval_scalars(directory: Path, metrics: Mapping[str, Any], step: int) -> None:
    from hat_jax.train.metrics import MetricsWriter

    if not is_primary():  # one process writes the run's files
        return
    values = {f"eval/{suite}/{key}": float(v) for suite, block in _metrics_only(metrics).items() if block
              for key, v in block.items() if v is not None}  # a reading metric is None when undefined (no calls)
    mtp = metrics.get("mtp")
    if mtp:
        values.update({f"eval/mtp/{key}": float(mtp[key]) for key in ("acceptance_depth1", "mean_accepted_length")})
    with MetricsWriter(directory) as writer:
        writer.scalars(step, values)


def with_item_intervals(results: Mapping[str, Any], experiment: Experiment, scale: Scale, out_root: Path) -> dict:
    """`results` with "eval_key", "eval_dirs" (each seed's evaluation folder, relative to `out_root`), "items"
    (each seed's per-item scores from its evaluation's files) and the intervals they give ("intervals",
    "interval_method"; `hat_jax.experiments.intervals`). A results.json written
    before per-item scores were stored gets them here when its evaluations' files are still on disk.

    Raises:
      ValueError: two seeds evaluated on different items of a suite (`item_block`).
    """
    keys = chain_keys(scale, experiment.chain)
    final = keys[-1] if keys else base_key(scale)
    dirs = [eval_dir(final, seed, scale, out_root) for seed in results["seeds"]]
    per_item = [read_item_scores(d) for d in dirs]
    out = dict(results, eval_key=eval_key(scale), items=item_block(per_item, results["per_seed"], experiment.name),
               eval_dirs=[d.relative_to(out_root).as_posix() for d in dirs])
    out["intervals"], out["interval_method"] = reported_intervals(out)
    return out


def run_experiment(experiment: Experiment, scale: Scale, seeds: Sequence[int], out_root: str | Path, *,
                   resume: bool = False, progress: bool = True) -> dict:
    """Runs `experiment` at `scale` for every seed and writes its outputs (module docstring); returns results.json.

    Raises:
      FileExistsError / RunConfigMismatchError: see `check_run_dir`. Stage errors propagate (a stage's
      checkpoints stay on disk, and `--resume` continues from them).
    """
    out_root = Path(out_root).resolve()
    exp_dir = out_root / experiment.name
    run_config = run_config_for(experiment, scale, seeds)
    check_run_dir(exp_dir, run_config, resume)
    results_path = exp_dir / "results.json"
    if results_path.is_file():
        log.info("%s: already complete (%s)", experiment.name, results_path)
        results = json.loads(results_path.read_text())
        return results if "items" in results else with_item_intervals(results, experiment, scale, out_root)
    if _failed_start(exp_dir):
        log.info("%s: no seed finished in the earlier start; starting it again", exp_dir)
    write_json_atomic(exp_dir / "run_config.json", run_config)
    kinds = [s.kind for s in experiment.chain]
    log.info("%s (%s): %s; budget %s", experiment.name, scale.name,
             " -> ".join(["base"] + [str(s) for s in experiment.chain]), describe(scale, kinds))

    t0 = time.perf_counter()
    per_seed, seed_records = [], []
    for seed in seeds:
        seed_path = exp_dir / f"seed{seed}.json"
        if seed_path.is_file():
            record = json.loads(seed_path.read_text())
        else:
            final, key, stages, base = run_chain(experiment.chain, scale, seed, out_root, progress=progress,
                                                 tag=experiment.name)
            evaluation = evaluate_cached(final, key, seed, scale, out_root, progress=progress)
            record = {"seed": seed, "checkpoint": str(final), "stages": stages, "base": base,
                      "metrics": evaluation["metrics"], "eval_wall_s": evaluation["wall_s"]}
            record["wall_s"] = _seed_wall(record)
            _log_eval_scalars(exp_dir / "eval" / f"seed{seed}", evaluation["metrics"],
                              sum(s["steps"] for s in stages))
            write_json_atomic(seed_path, record)
        seed_records.append(record)
        per_seed.append(_metrics_only(record["metrics"]))
    if seed_records[0]["stages"]:
        for i, stage in enumerate(seed_records[0]["stages"]):
            write_json_atomic(exp_dir / "stages" / f"{i + 1}-{stage['name']}.json", stage)

    mean, _ = aggregate(per_seed)   # the intervals: `with_item_intervals` below
    stages = []
    for i, stage in enumerate(seed_records[0]["stages"]):
        walls = [r["stages"][i]["wall_s"] for r in seed_records]
        stages.append({"name": stage["name"], "harness": stage["harness"], "steps": stage["steps"],
                       "wall_s": round(sum(walls), 3), "wall_s_per_seed": walls,
                       "cached": all(r["stages"][i]["cached"] for r in seed_records),
                       "dirs": [r["stages"][i]["dir"] for r in seed_records]})
    results = {
        "experiment": experiment.name, "preset": scale.name, "world_harness": scale.eval.world.harness,
        "seeds": [int(s) for s in seeds], "wall_s": round(sum(r.get("wall_s", 0.0) for r in seed_records), 3),
        "wall_s_this_invocation": round(time.perf_counter() - t0, 3), "stages": stages, "metrics": mean, "per_seed": per_seed,
        "chain": [str(s) for s in experiment.chain], "paper": dict(experiment.paper),
        "base": seed_records[0]["base"], "eval_wall_s": [r["eval_wall_s"] for r in seed_records],
        "extra": [r["metrics"].get("extra") for r in seed_records], "budget": describe(scale, kinds),
        "mtp": mtp_summary(seed_records),
    }
    results = with_item_intervals(results, experiment, scale, out_root)
    check_results(results)
    write_json_atomic(results_path, results)
    if is_primary():
        (exp_dir / "results.md").write_text(experiment_markdown(results, experiment), encoding="utf-8")
    log.info("%s: results in %s", experiment.name, exp_dir)
    return results
