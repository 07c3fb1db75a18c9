"""Training-stage speed on this CPU: SFT tokens/s, OPD seconds per step, RL seconds per step split into
generation / environment / training, and RL rollout tokens/s. A script that prints figures (not a test).

    .venv/bin/python experiments/benchmarks/train_bench.py [--preset tiny] [--steps 4] [--sft-seq-len 2048]
        [--sft-batch 8] [--hsa on|off] [--rl-group-size 4] [--rl-tasks 4] [--rl-max-new-tokens 128]
        [--rl-max-turns 6] [--opd-prompts 8] [--opd-samples 4] [--opd-max-new-tokens 128]
        [--stages sft,opd,rl] [--sft-set K=V ...] [--opd-set K=V ...] [--rl-set K=V ...]
        [--workdir DIR] [--keep] [--json OUT]

What is measured, and how
-------------------------
The stages' own code, nothing re-implemented: each stage runs in its own child process (this file with
`--worker sft|opd|rl`, one after the other, so no jit cache or thread pool carries over and each stage's
first step includes its own compilation) which calls the stage's CLI entry point `hat_jax.train.<stage>.main`
with the argv printed in the report (the same as `python -m hat_jax.train.<stage> ...`; `main` reads the
stage's section of the `--preset` scale config, applies `--steps` and the `--set` overrides the stage's config
dataclass defines, and calls `run_sft` / `run_opd` / `run_rl`). The chain: SFT from a fresh `--preset` init (its own BPE tokenizer,
cached under the `hat_jax.data.world_data` cache root) -> its run dir is the `--init` (and tokenizer, and
for OPD also the teacher) of OPD and RL. All run dirs are under a temp dir (`--workdir`), removed at the end
unless `--keep`.

Every stage runs with `--set log_every=1` (one `metrics.jsonl` row per step, so the window means that the
stages log are single-step values) and a `ckpt_every` beyond `--steps` (the only checkpoint is the final
one, written after the last row). The figures are read from the run dir's `metrics.jsonl`:
- Step wall time: the difference of consecutive rows' `time` stamps (each row is written right after its
  step's metrics are fetched to the host, so it covers the batch/rollout, the update and the row write).
  Step 1's is measured from the moment the stage enters `hat_jax.train.trainer.run_stage` (the worker wraps
  that function to record `time.time()`; the wrapper changes nothing else). Before that, "setup" = process
  start -> loop start (imports, data/world generation, tokenizer, checkpoint loads, jit-free setup).
- Steady state = steps 2..N (median, plus mean and min); step 1 (compilation) is reported on its own.
  With `--steps N` there are N-1 steady steps.
- SFT: rows of `data.seq_len` tokens, `data.batch_size` per step (right-padded, not packed).
  `padded tok/s` = batch_size x seq_len / step wall time (what the model computes);
  `real tok/s` = the stage's own `train/tokens_per_s` (attention_mask = 1 tokens over the step's wall
  time, `run_stage`); `loss tok` = `train/loss_tokens` (assistant tokens the CE is averaged over).
- OPD: B = prompts_per_step x samples_per_prompt rows, completions of at most max_new_tokens, rows padded
  to seq_len; the stage's `time/generation_s` (sampler, current student params), `time/teacher_s` (frozen
  teacher forward), `time/train_s` (jitted update until `block_until_ready`) and `rollout/gen_tokens_per_s`
  (sampled completion tokens / generation seconds) for both losses ("sampled" and "exact"; `--opd-losses`),
  each its own run from the same SFT init.
- RL: N = tasks_per_step x group_size (G) episodes of at most max_turns model turns of max_new_tokens,
  `env.max_tool_rounds` tool rounds, sequences capped at seq_len; the stage's `time/generation_s` (sampler
  calls), `time/env_s` (simulator + judges + rewards), `time/tokenize_s`, `time/rollout_s` (the whole
  rollout call), `time/train_s` (jitted update until the metrics are ready, ppo_epochs x ppo_minibatches
  updates of accum_steps micro-batches), `rollout/tokens` (sampled tokens in the step),
  `rollout/tokens_per_s` (= rollout/tokens / time/generation_s, the rollout code's own figure); "other" =
  step wall time - generation - env - tokenize - train (advantages, padding, host->device copies,
  metrics). `rollout tok/s (wall)` = rollout/tokens / time/rollout_s (generation + env + tokenize).
  `--rl-harness` (default hsa, the preset's) picks original or HSA-perturbed harnesses.
- XLA compilation: the worker registers a `jax.monitoring` time-span listener for the backend-compile
  event ("/jax/core/compile/backend_compile_duration", one per XLA compilation, `time.time()` stamps) and
  assigns each compile to the step whose window holds its end. Compiles ending after row time - time/train_s
  belong to the update ("compile_train_s"), the others to the batch phase (sampler / teacher / env:
  "compile_batch_s"); `net/generation_s` = time/generation_s - compile_batch_s, `net/train_s` =
  time/train_s - compile_train_s (OPD: net/generation_s = generation + teacher - compile_batch_s, since
  its batch phase compiles the teacher forward too); RL's net rollout tok/s = rollout/tokens /
  net/generation_s (its batch-phase compiles are the sampler's, apart from ~0.1 s of small jits).
- OPD's teacher is the stage default (= its --init, the SFT run), so the KL is ~0: the cost is that of any
  teacher of the same architecture (one forward per row), not a distillation result.
- `--report-only` re-reads a kept `--workdir` (marks, metrics.jsonl) with the same flags and runs nothing
  (its load average and "done in" are of the re-read, not of the run).

Notes
-----
- RL and OPD steps are not all the same shape: the sampler compiles per prompt-length bucket and the RL
  update per padded length (a multiple of train_bucket), so a steady step can still compile a new shape
  (seen as an outlier; the per-step lists are in the JSON and printed with --verbose). Episode lengths,
  turns and completion lengths depend on what the (barely trained) policy samples, so RL/OPD step times
  from a short SFT init are not those of a trained policy (which stops earlier or calls more tools).
- Wall-clock on a shared 2-core machine: the load average at start and end is printed; another busy
  process slows XLA:CPU's 2-thread pool about 1.6x per busy core (see model_bench.py).
- A failing stage is reported (its exit status and the tail of its log) and the chain goes on where it can
  (OPD/RL need the SFT run dir).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STAGES = ("sft", "opd", "rl")
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # jax._src.dispatch (jax 0.10)


def _maxrss_bytes() -> int:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r if sys.platform == "darwin" else r * 1024


# ==================================================================================================
# worker: one stage through its own CLI entry point, with the loop start recorded
# ==================================================================================================
def worker(stage: str, out_json: str, stage_argv: list[str]) -> int:
    t_start = time.time()
    import importlib

    import hat_jax.train.trainer as trainer

    module = importlib.import_module(f"hat_jax.train.{stage}")
    marks: dict = {"process_start": t_start, "imported": time.time(), "compiles": []}
    original = trainer.run_stage

    def on_span(event, start, end, **kwargs):  # XLA backend compiles: (end time, seconds, function)
        if event == BACKEND_COMPILE_EVENT:
            marks["compiles"].append((end, end - start, str(kwargs.get("fun_name", ""))))

    try:
        import jax.monitoring

        jax.monitoring.register_event_time_span_listener(on_span)
    except (ImportError, AttributeError):  # another jax: no compile figures
        marks.pop("compiles")

    def timed_run_stage(*args, **kwargs):
        marks.setdefault("loop_start", time.time())
        return original(*args, **kwargs)

    # The stage calls run_stage by the name it imported; wrap it wherever a hat_jax.train module holds it.
    for name, mod in list(sys.modules.items()):
        if name.startswith("hat_jax.train") and getattr(mod, "run_stage", None) is original:
            mod.run_stage = timed_run_stage
    rc = 0
    try:
        rc = module.main(stage_argv) or 0
    except SystemExit as err:  # argparse
        rc = err.code if isinstance(err.code, int) else 1
    except Exception as err:  # reported by the parent
        import traceback

        traceback.print_exc()
        marks["error"] = f"{type(err).__name__}: {err}"
        rc = 1
    marks.update(end=time.time(), maxrss=_maxrss_bytes(), rc=rc)
    with open(out_json, "w") as f:
        json.dump(marks, f)
    return rc


# ==================================================================================================
# parent
# ==================================================================================================
def _read_rows(run_dir: str) -> list[dict]:
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _stats(xs: list[float]) -> dict | None:
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    return {"median": statistics.median(xs), "mean": statistics.fmean(xs), "min": min(xs), "max": max(xs),
            "n": len(xs)}


def _per_step(rows: list[dict], marks: dict, shape_rows: int | None = None) -> list[dict]:
    """rows (one per step) with 'wall_s' added: time since the previous row (step 1: since the loop start)."""
    out, prev = [], marks.get("loop_start")
    compiles = marks.get("compiles")
    for row in sorted(rows, key=lambda r: r["step"]):
        r = dict(row)
        r["wall_s"] = row["time"] - prev if prev is not None else None
        if compiles is not None and prev is not None:
            inside = [c for c in compiles if prev < c[0] <= row["time"]]
            r["compile_s"], r["compiles"] = sum(c[1] for c in inside), float(len(inside))
            if row.get("time/train_s") is not None:  # the update runs last in a step, just before the row
                cut = row["time"] - row["time/train_s"]
                r["compile_train_s"] = sum(c[1] for c in inside if c[0] > cut)
                r["compile_batch_s"] = r["compile_s"] - r["compile_train_s"]
                r["net/train_s"] = row["time/train_s"] - r["compile_train_s"]
                if row.get("time/generation_s") is not None:  # OPD: generation + teacher forward
                    r["net/generation_s"] = row["time/generation_s"] + (row.get("time/teacher_s") or 0.0) \
                        - r["compile_batch_s"]
                if row.get("rollout/tokens") and r.get("net/generation_s", 0) > 0:
                    r["net/rollout_tokens_per_s"] = row["rollout/tokens"] / r["net/generation_s"]
        prev = row["time"]
        out.append(r)
    return out


def _series(steps: list[dict], key: str, steady: bool) -> list[float]:
    chosen = steps[1:] if steady else steps[:1]
    return [s.get(key) for s in chosen if s.get(key) is not None]


def summarize(stage: str, steps: list[dict], marks: dict, shape: dict) -> dict:
    res: dict = {"shape": shape, "steps_logged": len(steps)}
    if marks.get("loop_start"):
        res["setup_s"] = marks["loop_start"] - marks["process_start"]
    if not steps:
        return res
    if marks.get("compiles") is not None and marks.get("loop_start"):
        before = [c for c in marks["compiles"] if c[0] <= marks["loop_start"]]
        res["setup_compile_s"], res["setup_compiles"] = sum(c[1] for c in before), len(before)
    keys = ["wall_s", "compile_s", "compiles"] + sorted({k for s in steps for k in s if k.startswith(("time/", "rollout/", "train/", "kl/", "net/", "compile_",
                                                                              "reward/", "policy/"))})
    res["first_step"] = {k: (steps[0].get(k)) for k in keys if steps[0].get(k) is not None}
    res["steady"] = {k: st for k in keys if (st := _stats(_series(steps, k, True))) is not None}
    res["per_step"] = [{k: s.get(k) for k in ["step"] + keys if s.get(k) is not None} for s in steps]
    if stage == "sft":
        bt = shape["batch_size"] * shape["seq_len"]
        res["padded_tokens_per_s"] = _stats([bt / s["wall_s"] for s in steps[1:] if s.get("wall_s")])
    if stage == "rl":
        res["rollout_tokens_per_s_wall"] = _stats([s["rollout/tokens"] / s["time/rollout_s"] for s in steps[1:]
                                                   if s.get("time/rollout_s") and "rollout/tokens" in s])
        other = []
        for s in steps[1:]:
            parts = [s.get(k) or 0.0 for k in ("time/generation_s", "time/env_s", "time/tokenize_s", "time/train_s")]
            if s.get("wall_s") is not None:
                other.append(s["wall_s"] - sum(parts))
        res["steady"]["other_s"] = _stats(other)
    return res


def run_stage_child(stage: str, stage_argv: list[str], workdir: str, timeout: float,
                    name: str | None = None) -> tuple[dict, str]:
    marks_path = os.path.join(workdir, f"{name or stage}.marks.json")
    log_path = os.path.join(workdir, f"{name or stage}.log")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", stage, "--worker-out", marks_path, "--",
           *stage_argv]
    t0 = time.time()
    with open(log_path, "w") as log:
        try:
            proc = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    marks = {"process_start": t0}
    if os.path.exists(marks_path):
        with open(marks_path) as f:
            marks = json.load(f)
    marks["rc"] = rc
    marks["wall_total_s"] = time.time() - t0
    with open(log_path, encoding="utf-8", errors="replace") as f:
        tail = f.read()[-3000:]
    return marks, tail


def _fmt(x, digits=2):
    if x is None:
        return "-"
    if isinstance(x, dict):
        x = x.get("median")
        if x is None:
            return "-"
    return f"{x:.{digits}f}" if abs(x) < 1e4 else f"{x:.0f}"


def _fname(label: str) -> str:
    return label.replace("[", "_").replace("]", "")


def _cmd_text(stage: str, argv: list[str]) -> str:
    return "python -m hat_jax.train." + stage + " " + " ".join(a if " " not in a else repr(a) for a in argv)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="tiny", help="scale config (configs/NAME.py) whose sft/opd/rl sections the stages run")
    ap.add_argument("--steps", type=int, default=4, help="steps per stage (step 1 = compilation, reported apart)")
    ap.add_argument("--stages", default="sft,opd,rl", help="comma list of sft,opd,rl (opd/rl need sft)")
    ap.add_argument("--sft-seq-len", type=int, help="SFT data.seq_len (default: the preset's)")
    ap.add_argument("--sft-batch", type=int, help="SFT data.batch_size (default: the preset's)")
    ap.add_argument("--hsa", choices=("on", "off"), help="SFT harness switch (default: the preset's p_hsa)")
    ap.add_argument("--rl-group-size", type=int, help="RL group_size G (default: the preset's)")
    ap.add_argument("--rl-tasks", type=int, help="RL tasks_per_step (default: the preset's)")
    ap.add_argument("--rl-max-new-tokens", type=int, help="RL max_new_tokens per turn (default: the preset's)")
    ap.add_argument("--rl-max-turns", type=int, help="RL max_turns (default: the preset's)")
    ap.add_argument("--rl-harness", choices=("original", "hsa"), help="RL harness mode (default: the preset's)")
    ap.add_argument("--opd-prompts", type=int, help="OPD prompts_per_step (default: the preset's)")
    ap.add_argument("--opd-samples", type=int, help="OPD samples_per_prompt (default: the preset's)")
    ap.add_argument("--opd-max-new-tokens", type=int, help="OPD max_new_tokens (default: the preset's)")
    ap.add_argument("--opd-losses", default="sampled", help="comma list of OPD losses to time: sampled,exact")
    for s in STAGES:
        ap.add_argument(f"--{s}-set", action="append", default=[], metavar="KEY=VALUE",
                        help=f"extra --set override for the {s.upper()} stage")
    ap.add_argument("--stage-timeout", type=float, default=1800, help="seconds before a stage's child is killed")
    ap.add_argument("--workdir", help="run dirs go here (default: a new temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the run dirs")
    ap.add_argument("--report-only", action="store_true",
                    help="run nothing: re-read the run dirs and marks of a kept --workdir (same settings)")
    ap.add_argument("--verbose", action="store_true", help="print every step's figures")
    ap.add_argument("--json", help="write all figures here")
    ap.add_argument("--worker", choices=STAGES, help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    ap.add_argument("stage_argv", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args.worker, args.worker_out, args.stage_argv)
    if args.steps < 2:
        ap.error("--steps must be >= 2 (step 1 includes compilation and is reported apart)")

    sys.path.insert(0, REPO)
    from hat_jax.train.stage import stage_section

    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    workdir = args.workdir or tempfile.mkdtemp(prefix="train_bench.")
    os.makedirs(workdir, exist_ok=True)
    never = str(10 ** 9)  # ckpt_every: only the final checkpoint
    load0 = os.getloadavg()
    results: dict = {"preset": args.preset, "steps": args.steps, "cores": len(os.sched_getaffinity(0)),
                     "load_start": load0, "workdir": workdir, "stages": {}}
    print(f"train_bench: preset {args.preset}, {args.steps} steps per stage, {results['cores']} cores, "
          f"load {', '.join(f'{x:.2f}' for x in load0)}, run dirs under {workdir}", flush=True)

    sft_dir = os.path.join(workdir, "sft")
    runs: list[tuple[str, str, list[str], dict]] = []
    # ---- SFT
    sc = stage_section(args.preset, "sft")
    seq_len = args.sft_seq_len or sc.data.seq_len
    batch = args.sft_batch or sc.data.batch_size
    sets = ["log_every=1", f"ckpt_every={never}", f"data.seq_len={seq_len}", f"data.batch_size={batch}",
            *args.sft_set]
    sft_argv = ["--preset", args.preset, "--out", sft_dir, "--steps", str(args.steps), "--no-progress"]
    if args.hsa:
        sft_argv += ["--hsa", args.hsa]
    for s in sets:
        sft_argv += ["--set", s]
    p_hsa = (0.0 if args.hsa == "off" else (sc.data.p_hsa or 0.5)) if args.hsa else sc.data.p_hsa
    runs.append(("sft", "sft", sft_argv, {"batch_size": batch, "seq_len": seq_len, "p_hsa": p_hsa,
                                          "accum_steps": sc.accum_steps}))
    # ---- OPD
    oc = stage_section(args.preset, "opd")
    prompts = args.opd_prompts or oc.prompts_per_step
    samples = args.opd_samples or oc.samples_per_prompt
    mnt = args.opd_max_new_tokens or oc.max_new_tokens
    for loss in [x.strip() for x in args.opd_losses.split(",") if x.strip()]:
        sets = ["log_every=1", f"ckpt_every={never}", f"prompts_per_step={prompts}",
                f"samples_per_prompt={samples}", f"max_new_tokens={mnt}", *args.opd_set]
        argv_ = ["--preset", args.preset, "--init", sft_dir, "--out", os.path.join(workdir, f"opd_{loss}"),
                 "--steps", str(args.steps), "--loss", loss, "--no-progress"]
        for s in sets:
            argv_ += ["--set", s]
        runs.append(("opd", f"opd[{loss}]", argv_, {"prompts_per_step": prompts, "samples_per_prompt": samples,
                                                    "rows": prompts * samples, "max_new_tokens": mnt,
                                                    "seq_len": oc.seq_len, "loss": loss}))
    # ---- RL
    rc_ = stage_section(args.preset, "rl")
    g = args.rl_group_size or rc_.group_size
    tasks = args.rl_tasks or rc_.tasks_per_step
    rmnt = args.rl_max_new_tokens or rc_.max_new_tokens
    turns = args.rl_max_turns or rc_.max_turns
    accum = rc_.accum_steps
    while (tasks * g) % (accum * rc_.ppo_minibatches):  # keep the preset's accum when it divides the rows
        accum -= 1
    sets = ["log_every=1", f"ckpt_every={never}", f"group_size={g}", f"tasks_per_step={tasks}",
            f"max_new_tokens={rmnt}", f"max_turns={turns}", f"accum_steps={accum}", *args.rl_set]
    rl_argv = ["--preset", args.preset, "--init", sft_dir, "--out", os.path.join(workdir, "rl"),
               "--steps", str(args.steps), "--no-progress"]
    if args.rl_harness:
        rl_argv += ["--harness", args.rl_harness]
    for s in sets:
        rl_argv += ["--set", s]
    runs.append(("rl", "rl", rl_argv, {"tasks_per_step": tasks, "group_size": g, "episodes": tasks * g,
                                       "max_new_tokens": rmnt, "max_turns": turns, "seq_len": rc_.seq_len,
                                       "accum_steps": accum, "harness": args.rl_harness or rc_.harness_mode,
                                       "max_tool_rounds": rc_.env.max_tool_rounds}))

    sft_ok = os.path.exists(os.path.join(sft_dir, "tokenizer"))
    for stage, label, stage_argv, shape in runs:
        if stage not in stages:
            continue
        if stage != "sft" and not sft_ok:
            results["stages"][label] = {"skipped": "no SFT run dir (SFT not run or failed)"}
            print(f"[{label}] skipped: no SFT run dir", flush=True)
            continue
        print(f"[{label}] {_cmd_text(stage, stage_argv)}", flush=True)
        if args.report_only:  # re-read a kept workdir
            marks, tail = {"process_start": None}, ""
            mpath = os.path.join(workdir, f"{_fname(label)}.marks.json")
            if os.path.exists(mpath):
                with open(mpath) as f:
                    marks = json.load(f)
        else:
            marks, tail = run_stage_child(stage, stage_argv, workdir, args.stage_timeout, _fname(label))
        run_dir = stage_argv[stage_argv.index("--out") + 1]
        steps = _per_step(_read_rows(run_dir), marks, shape.get("rows"))
        res = summarize(stage, steps, marks, shape)
        res.update(command=_cmd_text(stage, stage_argv), rc=marks.get("rc"), process_s=marks.get("wall_total_s"),
                   maxrss=marks.get("maxrss"))
        if marks.get("rc") != 0:
            res["error"] = marks.get("error") or f"exit status {marks.get('rc')}"
            res["log_tail"] = tail
            print(f"[{label}] FAILED ({res['error']}); log tail:\n{tail}", flush=True)
        if stage == "sft":
            sft_ok = marks.get("rc") == 0
        results["stages"][label] = res
        print(f"[{label}] done in {marks.get('wall_total_s', 0):.0f} s (setup {_fmt(res.get('setup_s'), 1)} s, "
              f"{res['steps_logged']} steps logged)", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)

    results["load_end"] = os.getloadavg()
    _print_report(results, args.verbose)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if not args.keep and not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if all(r.get("rc", 0) == 0 for r in results["stages"].values() if "skipped" not in r) else 1


def _print_report(results: dict, verbose: bool) -> None:
    print()
    print(f"== training stages, preset {results['preset']}, {results['cores']} cores; steady = median over steps "
          f"2..{results['steps']} (min in brackets); step 1 = first step incl. compilation ==")
    for label, res in results["stages"].items():
        if "skipped" in res:
            print(f"\n[{label}] skipped: {res['skipped']}")
            continue
        st, first, sh = res.get("steady", {}), res.get("first_step", {}), res["shape"]
        print(f"\n[{label}] {json.dumps(sh)}")
        print(f"  setup {_fmt(res.get('setup_s'), 1)} s, process {_fmt(res.get('process_s'), 1)} s, "
              f"maxrss {(res.get('maxrss') or 0) / 2**30:.2f} GiB" + (f", ERROR {res['error']}" if "error" in res else ""))
        if not st:
            continue
        wall = st.get("wall_s")
        mn = lambda k: _fmt(st.get(k, {}).get("min")) if st.get(k) else "-"
        print(f"  step wall s: steady {_fmt(wall)} [{mn('wall_s')}]   step 1 {_fmt(first.get('wall_s'))}")
        if "compile_s" in first:
            print(f"  XLA compile s in the step: steady {_fmt(st.get('compile_s'))} (max "
                  f"{_fmt(st.get('compile_s', {}).get('max'))}, compiles/step {_fmt(st.get('compiles'), 1)})   step 1 "
                  f"{_fmt(first.get('compile_s'))} ({first.get('compiles', 0):.0f} compiles)")
        if label == "sft":
            print(f"  padded tok/s (B*T / step): {_fmt(res.get('padded_tokens_per_s'), 0)}   real tok/s "
                  f"(train/tokens_per_s): {_fmt(st.get('train/tokens_per_s'), 0)}   loss tok/step: "
                  f"{_fmt(st.get('train/loss_tokens'), 0)}")
        elif label.startswith("opd"):
            for k in ("time/generation_s", "time/teacher_s", "time/train_s"):
                print(f"  {k:22s} steady {_fmt(st.get(k))} [{mn(k)}]   step 1 {_fmt(first.get(k))}")
            print(f"  net of XLA compiles: generation + teacher {_fmt(st.get('net/generation_s'))} s, train "
                  f"{_fmt(st.get('net/train_s'))} s   step 1: {_fmt(first.get('net/generation_s'))} s, "
                  f"{_fmt(first.get('net/train_s'))} s")
            print(f"  gen tok/s {_fmt(st.get('rollout/gen_tokens_per_s'), 0)}   completion_len "
                  f"{_fmt(st.get('rollout/completion_len'), 1)}   finished {_fmt(st.get('rollout/finished_frac'))}")
        else:
            for k in ("time/generation_s", "time/env_s", "time/tokenize_s", "time/train_s", "other_s",
                      "time/rollout_s"):
                print(f"  {k:22s} steady {_fmt(st.get(k))} [{mn(k)}]   step 1 {_fmt(first.get(k))}")
            print(f"  net of XLA compiles: generation {_fmt(st.get('net/generation_s'))} s, train "
                  f"{_fmt(st.get('net/train_s'))} s, rollout tok/s {_fmt(st.get('net/rollout_tokens_per_s'), 0)}"
                  f"   (compile in batch/train phase {_fmt(st.get('compile_batch_s'))}/{_fmt(st.get('compile_train_s'))} s)")
            print(f"  rollout tokens/step {_fmt(st.get('rollout/tokens'), 0)}   tok/s (generation) "
                  f"{_fmt(st.get('rollout/tokens_per_s'), 0)}   tok/s (rollout wall) "
                  f"{_fmt(res.get('rollout_tokens_per_s_wall'), 0)}   turns {_fmt(st.get('rollout/turns'))}   "
                  f"seq_len {_fmt(st.get('rollout/seq_len'), 0)}")
        if verbose:
            for s in res.get("per_step", []):
                print("   ", json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in s.items()}))
    print(f"\nload average: start {', '.join(f'{x:.2f}' for x in results['load_start'])}, end "
          f"{', '.join(f'{x:.2f}' for x in results['load_end'])} (1/5/15 min)")


if __name__ == "__main__":
    sys.exit(main())
