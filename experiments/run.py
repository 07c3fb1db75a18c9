"""Runs an ablation experiment (a row of the HAT report's Tables 3-6) or a whole table, and writes its results.

    python experiments/run.py --exp table6_both                 # the main job: tiny preset, CPU, ~17 minutes on 2 cores
    python experiments/run.py --exp table6 --resume             # every row of Table 6 (finished ones reused), the table
    python experiments/run.py --exp table6_both --seeds 0,1,2 --out runs3   # mean and 95% interval over seeds
    python experiments/run.py --exp table3_hat --preset qwen3_6_35b_a3b --set base.hf_path=/ckpt/Qwen3.6-35B-A3B
    python experiments/run.py --list

Options: --preset micro|tiny|qwen3_6_35b_a3b (default tiny; the scale config configs/NAME.py, or a FILE.py),
--seeds (default 0), --out (default runs/),
--resume (reprint a finished run, continue an interrupted one; a group runs its unfinished rows only),
--set section.field=value
(sections: base, sft, opd, rl, opd_live, teacher, eval; e.g. --set sft.steps=50 --set eval.world.eval_items=100;
--set world.harness=NAME sets every section's world harness),
--ifeval-data FILE (the official IFEval input_data.jsonl; default $HAT_IFEVAL_DATA, then the hub, else skipped),
--no-progress; several processes (hosts): --coordinator HOST:PORT --num-processes N --process-id I, or
--distributed (auto-detected, e.g. on a TPU pod slice), on every host. Outputs: DIR/<experiment>/results.json,
results.md, eval curves; a group also DIR/<group>.md (its table, differences with 95% intervals, the verdicts of
the claims C1-C5 that rest on its rows; `python experiments/claims.py DIR` judges all of them);
DIR/stages/ (stage run dirs, checkpoints, TensorBoard); `tensorboard --logdir DIR`.
Exit status: 0 done, 2 bad input or a failed stage (message on stderr), 130 interrupted (rerun with --resume).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a clone without installing
    sys.path.insert(0, str(ROOT))

from hat_jax.experiments.declarations import DeclarationError, load_all, resolve  # noqa: E402
from hat_jax.experiments.scales import SCALES, apply_scale_overrides, get_scale  # noqa: E402

log = logging.getLogger("run")
# transformers is used for its tokenizers only; without torch it prints "PyTorch was not found" on import
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",")]  # an empty item ("0,,1", "0,") is an error, not skipped
    except ValueError:
        raise ValueError(f"--seeds {text!r}: expected comma-separated integers, e.g. 0,1,2") from None
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise ValueError(f"--seeds {text!r}: expected distinct non-negative integers, e.g. 0,1,2")
    return seeds


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python experiments/run.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--exp", help="experiment (a table row) or group (table3, table4, table5, table6)")
    parser.add_argument("--preset", default="tiny",
                        help=f"scale config: {', '.join(SCALES)} (configs/NAME.py) or a FILE.py (default tiny)")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    parser.add_argument("--out", default="runs", help="output root (default runs/)")
    parser.add_argument("--resume", action="store_true",
                        help="reuse what --out already holds: reprint a finished run, continue an interrupted one "
                             "(a group runs its unfinished rows only); refused if --out holds another configuration")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                        help="override a config field, e.g. sft.steps=50, rl.group_size=8, eval.world.eval_items=100; "
                             "world.harness=NAME sets the harness of every section's world (production, compact or "
                             "a folder)")
    parser.add_argument("--ifeval-data", help="the official IFEval input_data.jsonl (default: $HAT_IFEVAL_DATA)")
    parser.add_argument("--list", action="store_true", help="list every experiment with a one-line description")
    parser.add_argument("--ablations", default=None, help=argparse.SUPPRESS)  # another declarations dir (tests)
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bars: one log line per logging window with s/step and ETA (for log files)")
    from hat_jax.train.distributed import add_distributed_args

    add_distributed_args(parser)  # several processes: every host runs the same command (docs/real_scale.md)
    return parser


def list_experiments(groups) -> str:
    width = max(len(name) for g in groups.values() for name in [g.name] + [f"  {r.name}" for r in g.rows]) + 2
    lines = []
    for group in groups.values():
        lines.append(f"{group.name:<{width}}{group.title} (all {len(group.rows)} rows, then the table)")
        lines += [f"{'  ' + row.name:<{width}}{row.description}" for row in group.rows]
    return "\n".join(lines)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S", force=True)
    logging.getLogger("absl").setLevel(logging.WARNING)  # Orbax's per-checkpoint INFO lines drown the progress
    logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)  # "Unable to initialize backend 'tpu'"
    from hat_jax.train.distributed import initialize_from_args

    initialize_from_args(args)  # before anything touches a device; one process: nothing to do
    groups = load_all(args.ablations)
    if args.list:
        print(list_experiments(groups))
        return 0
    if not args.exp:
        raise ValueError("--exp is required (or --list to see the experiments)")
    group, rows = resolve(args.exp, groups)
    seeds = parse_seeds(args.seeds)
    scale = apply_scale_overrides(get_scale(args.preset), args.set)
    data = args.ifeval_data or os.environ.get("HAT_IFEVAL_DATA")
    if data:
        if not Path(data).is_file():
            raise FileNotFoundError(f"--ifeval-data / HAT_IFEVAL_DATA: {data!r} is not a file (expected the "
                                    "official IFEval input_data.jsonl, 541 lines)")
        scale = dataclasses.replace(scale, eval=dataclasses.replace(scale.eval, ifeval_data=str(Path(data).resolve())))

    from hat_jax.experiments.results import group_markdown
    from hat_jax.experiments.runner import check_run_dirs, run_experiment
    from hat_jax.train.stage import enable_compile_cache

    enable_compile_cache()
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"--out {str(out)!r} is a file, not a directory")
    check_run_dirs(rows, scale, seeds, out, args.resume)  # every row's directory before any training
    results = {}
    for row in rows:
        # With --resume a finished row returns its results.json as it is: a group redoes its unfinished rows only.
        results[row.name] = run_experiment(row, scale, seeds, out, resume=args.resume, progress=not args.no_progress)
        print(json.dumps({"experiment": row.name, "results": str((out / row.name / "results.json").resolve()),
                          "wall_s": results[row.name]["wall_s"]}))
    if len(rows) > 1:
        table = group_markdown(group, results, scale.name)
        from hat_jax.experiments.claims import CLAIMS, claims_markdown, load_run_results

        # the claims that rest on this group's rows, judged on every finished row of --out (claims span groups)
        claims = [c for c in CLAIMS if {r.name for r in rows} & {n for cond in c.conditions for n in cond.rows}]
        if claims:
            table += "\n" + claims_markdown({**load_run_results(out), **results}, claims)
        from hat_jax.train.distributed import is_primary

        if is_primary():
            (out / f"{group.name}.md").write_text(table, encoding="utf-8")
        print(table)
    else:
        print((out / rows[0].name / "results.md").read_text(encoding="utf-8"))
    return 0


def reexec_with_huge_pages() -> None:
    """Restarts this process once with `GLIBC_TUNABLES=glibc.malloc.hugetlb=1` (Linux, when no tunables are
    set). XLA:CPU allocates each step's large temporaries afresh and glibc returns buffers over 32 MiB to the
    kernel when freed, so every step faults their pages in again (~680k minor faults, ~1 s of system time per
    tiny SFT step); with transparent huge pages for those buffers the faults almost vanish (measured at the tiny
    preset's SFT step, 4 x 1,536 tokens, 2 cores: 635k -> 2k faults, 2.54 -> 1.62 s median;
    experiments/benchmarks/cpu_profile.py). An older glibc ignores the unknown tunable. Set `GLIBC_TUNABLES`
    yourself (even empty) to opt out."""
    if sys.platform.startswith("linux") and "GLIBC_TUNABLES" not in os.environ:
        os.environ["GLIBC_TUNABLES"] = "glibc.malloc.hugetlb=1"
        os.execv(sys.executable, [sys.executable, *sys.argv])


if __name__ == "__main__":
    reexec_with_huge_pages()
    from hat_jax.experiments.runner import RunConfigMismatchError
    from hat_jax.train.checkpoints import ConfigMismatchError, IncompatibleCheckpointError
    from hat_jax.train.trainer import NonFiniteLossError
    from hat_jax.train.distributed import DistributedStartError

    try:
        sys.exit(main())
    except (KeyError, ValueError, FileExistsError, FileNotFoundError, DeclarationError, RunConfigMismatchError,
            ConfigMismatchError, IncompatibleCheckpointError, NonFiniteLossError, DistributedStartError) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"error: {type(err).__name__}: {message}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted: finished stages and seeds are kept; rerun the same command with --resume to continue",
              file=sys.stderr)
        sys.exit(130)
