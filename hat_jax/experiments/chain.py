"""Running an experiment's chain of stages with shared prefixes computed once, and evaluating its checkpoint.

Layout under the output root `DIR` (`experiments/run.py --out`, default `runs/`):

    DIR/stages/<label>-<key>/seed<k>/   one stage's run dir (checkpoints, tokenizer/, TensorBoard, stage_done.json)
    DIR/stages/teacher-<key>/seed0/      Table 5's strong teacher (trained once)
    DIR/evals/<key>/seed<k>/<eval-key>/  an evaluation of a chain's final checkpoint (metrics.json, per-item files)

`<label>` is the chain up to the stage ("sft-hsa.rl-hsa"), `<key>` the first 10 hex digits of the SHA-256 of
everything that determines the stage's checkpoint: the base (its pretraining config, or the imported folder),
and for every stage of the prefix its kind, variant and resolved config (the scale's section with the stage's
overrides and its variant; init/teacher/seed excluded: they follow from the prefix and the seed directory),
plus the strong teacher's key for a stage that distils from it (`opd_live`). Two experiments whose chains
share a prefix therefore share its run dirs (Table 4's rows reuse each other's stages; `table3_hat` is
`table4_hsa_rl_hsa`; a stage override that leaves the config as it is changes nothing), and a changed `--set`
or override gives new keys from its stage on, never a silently reused checkpoint.

A stage is complete when its `stage_done.json` exists (written atomically once the stage's final checkpoint is
complete on disk, `finished_step`; a done stage whose checkpoint has since been damaged is refused with the
recovery);
a run dir without it (a killed run) is resumed from its latest checkpoint by the stage itself, which checks
that its config hash matches. The tiny base lives in the global cache (`hat_jax.train.pretrain.base_checkpoint`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Sequence
from typing import Any
from pathlib import Path

from hat_jax import cache
from hat_jax.cache import digest
from hat_jax.experiments.declarations import StageSpec
from hat_jax.experiments.scales import Scale
from hat_jax.experiments.stage_kinds import STAGE_KINDS, assignments, load_attr
from hat_jax.model import checkpoint_steps
from hat_jax.train.distributed import is_primary

log = logging.getLogger(__name__)
DONE_FILE = checkpoint_steps.DONE_FILE
# mesh, attention_impl, moe_impl, moe_token_chunk, rollout_wave_rows: where and with which kernels a stage runs,
# not what it computes
_NOT_HASHED = ("init", "teacher", "ref", "seed", "mesh", "attention_impl", "moe_impl", "moe_token_chunk",
               "rollout_wave_rows")


def write_json_atomic(path: Path, data: Any) -> None:
    """`hat_jax.cache.write_json_atomic` in process 0 only: the other processes of a multi-process run
    (`hat_jax.train.distributed.is_primary`) return without writing."""
    if is_primary():
        cache.write_json_atomic(path, data)


def _config_identity(config) -> dict:
    from hat_jax.train.stage import config_json

    data = config_json(config)
    return {k: v for k, v in data.items() if k not in _NOT_HASHED}


def base_key(scale: Scale) -> str:
    """The base's identity: the pretrained base's own name (`PretrainConfig.digest`: its config with every phase
    it continues, their seeds, the corpus each phase's generators make and the init scheme), or the imported
    folder's absolute path. A stage's `init` and `seed` are not part of its key (`_NOT_HASHED`), so a base's are
    named here through its digest."""
    if scale.base.pretrain is not None:
        return digest({"pretrain": scale.base.pretrain.digest()})
    return digest({"hf_path": str(Path(scale.base.hf_path).resolve())})


def teacher_key(scale: Scale) -> str:
    if scale.teacher.path is not None:
        return digest({"teacher_path": str(Path(scale.teacher.path).resolve())})
    return digest({"base": base_key(scale), "teacher_sft": _config_identity(scale.teacher.sft)})


def chain_keys(scale: Scale, chain: Sequence[StageSpec]) -> list[str]:
    """The key of every prefix of `chain` (module docstring); entry i is the key of stages 0..i."""
    keys, previous = [], base_key(scale)
    for spec in chain:
        config = stage_template(scale, spec)
        item = {"previous": previous, "stage": spec.name, "config": _config_identity(config)}
        if STAGE_KINDS[spec.kind].teacher == "strong":
            item["teacher"] = teacher_key(scale)
        previous = digest(item)
        keys.append(previous)
    return keys


def stage_template(scale: Scale, spec: StageSpec):
    """The stage config of `spec` at this scale, before init/teacher/seed are filled in: the scale's section of
    the kind, with the stage's overrides, then its variant (`hat_jax.experiments.stage_kinds`).

    Raises:
      ValueError: an override this scale's section refuses (a value out of range together with its fields).
    """
    kind = STAGE_KINDS[spec.kind]
    config = getattr(scale, kind.name)
    if spec.overrides:
        from hat_jax.train.stage import apply_overrides

        try:
            config = apply_overrides(config, assignments(spec.overrides))
        except ValueError as err:
            raise ValueError(f"stage {spec}: {err}") from None
    return kind.with_variant(config, spec.variant)


def _replace_path(config, path: str, value):
    head, _, rest = path.partition(".")
    inner = _replace_path(getattr(config, head), rest, value) if rest else value
    return dataclasses.replace(config, **{head: inner})


def stage_config(scale: Scale, spec: StageSpec, *, init: Path, seed: int, base: Path, teacher: Path | None):
    """The runnable config: the template with init (previous checkpoint or base), seed and teacher set.

    The experiment's seed is every stage's `seed` and also SFT's data seed (record order and HSA draws,
    `SFTDataConfig.seed`; the kind's `seed_fields`): SFT from a pretrained base has no other randomness, so
    without it every seed would train the same SFT stage. RL and OPD draw tasks, harnesses and samples from
    their `seed`. The teacher is the base (general OPD) or Table 5's strong teacher (live OPD).
    """
    kind = STAGE_KINDS[spec.kind]
    config = dataclasses.replace(stage_template(scale, spec), init=str(init))
    for field in kind.seed_fields:
        config = _replace_path(config, field, int(seed))
    if kind.teacher is not None:
        config = dataclasses.replace(config, teacher=str(base if kind.teacher == "base" else teacher))
    return config


def _run_stage(kind: str, config, out: Path, progress: bool):
    return load_attr(STAGE_KINDS[kind].run)(config, out, resume=True, progress=progress)


def finished_step(out: Path, context: str) -> int:
    """The final step of the finished stage run dir `out`: its latest complete step, with no damaged step after it.

    Raises:
      DamagedCheckpointError: no complete step, or a newer step is damaged (names the steps and the recovery;
        `context` says what claimed the stage finished).
    """
    from hat_jax.train.checkpoints import ITEMS

    scan = checkpoint_steps.scan_steps(out, ITEMS)
    if scan.latest is None or scan.newer_damaged():
        what = scan.warning() or (f"it holds no checkpoint step; move {out / DONE_FILE} aside and rerun to "
                                  f"train the stage again")
        raise checkpoint_steps.DamagedCheckpointError(f"stage {out} is {context} but its final checkpoint is not "
                                                      f"readable: {what}")
    return scan.latest


def run_stage_cached(kind: str, config, out: Path, record: dict, *, progress: bool = True, tag: str = "") -> dict:
    """Runs one stage into `out` unless its `stage_done.json` exists; returns that record.

    The record is `record` + {"steps", "wall_s" (this stage's training wall time, from the run that finished
    it), "resumed_from" (the step a killed run was resumed at, or null), "trained_by" (`tag`: the experiment
    that trained it)}.
    """
    done = out / DONE_FILE
    if done.is_file():
        finished_step(out, f"marked finished ({DONE_FILE})")
        return json.loads(done.read_text())
    from hat_jax.train.checkpoints import latest_step

    resumed = latest_step(out) if out.exists() else None
    t0 = time.perf_counter()
    _run_stage(kind, config, out, progress)
    finished_step(out, "done training")
    record = dict(record, steps=int(config.steps), wall_s=round(time.perf_counter() - t0, 3), resumed_from=resumed,
                  trained_by=tag)
    write_json_atomic(done, record)
    log.info("%s stage done: %d steps in %.0f s -> %s", kind, record["steps"], record["wall_s"], out)
    return record


def ensure_base(scale: Scale, out_root: Path, progress: bool = True) -> tuple[Path, dict]:
    """The base checkpoint dir and a record {"source", "dir", "wall_s" (this call), "trained" (whether this call
    pretrained or imported it), "report"} (pretrained and cached at tiny scale; imported once into
    DIR/stages/base-<key> at real scale)."""
    t0, started = time.perf_counter(), time.time()
    if scale.base.pretrain is not None:
        from hat_jax.train.pretrain import base_checkpoint

        path = Path(base_checkpoint(scale.base.pretrain, progress=progress))
        source = "pretrained"
        # the report is written once, at the end of the pretraining: a new one means this call trained the base
        trained = (path / "base_report.json").stat().st_mtime >= started
    else:
        if not scale.base.hf_path:
            raise ValueError(f"preset {scale.name!r} imports its base: pass --set base.hf_path=/path/to/hf_folder "
                             "(safetensors + config.json + tokenizer files)")
        from hat_jax.train.hf_base import import_hf_base

        path = out_root / "stages" / f"base-{base_key(scale)}"
        trained = not (path / DONE_FILE).is_file()
        if trained:
            import_hf_base(scale.base.hf_path, path)
            write_json_atomic(path / DONE_FILE, {"source": scale.base.hf_path})
        source = f"hf:{scale.base.hf_path}"
    wall = time.perf_counter() - t0
    report = path / "base_report.json"
    return path, {"source": source, "dir": str(path), "wall_s": round(wall, 3), "trained": trained,
                  "report": json.loads(report.read_text()) if report.is_file() else None}


def ensure_teacher(scale: Scale, base: Path, out_root: Path, progress: bool = True) -> Path:
    """Table 5's teacher: the given checkpoint, or HSA-SFT of the scale's teacher config trained once from a
    fresh init with the base's tokenizer (copied in first, so teacher and student share it)."""
    if scale.teacher.path is not None:
        return Path(scale.teacher.path)
    if scale.teacher.sft is None:
        raise ValueError(f"preset {scale.name!r} has no teacher to train: pass --set teacher.path=/path/to/checkpoint "
                         "(a checkpoint with the student's tokenizer)")
    import shutil

    from hat_jax.train.sft import with_hsa

    out = out_root / "stages" / f"teacher-{teacher_key(scale)}" / "seed0"
    from hat_jax.train.distributed import is_primary

    if is_primary() and not (out / DONE_FILE).is_file() and not (out / "tokenizer" / "tokenizer.json").is_file():
        out.mkdir(parents=True, exist_ok=True)
        shutil.copytree(base / "tokenizer", out / "tokenizer", dirs_exist_ok=True)
    config = dataclasses.replace(with_hsa(scale.teacher.sft, True), init=None, seed=0)
    log.info("teacher (Table 5): HSA-SFT of a larger model into %s", out)
    run_stage_cached("sft", config, out, {"name": "teacher", "harness": "hsa"}, progress=progress, tag="teacher")
    return out


def run_chain(chain: Sequence[StageSpec], scale: Scale, seed: int, out_root: Path, *, progress: bool = True,
              tag: str = "") -> tuple[Path, str, list[dict], dict]:
    """Runs (or reuses) every stage of `chain` for one seed.

    Returns:
      (final checkpoint dir, its key, one record per stage {"name", "harness", "steps", "wall_s", "dir",
       "cached" (trained by another experiment than `tag`, or before this call when it has no record of who),
       "resumed_from", "trained_by"}, the base record).
    """
    base, base_record = ensure_base(scale, out_root, progress)
    strong = any(STAGE_KINDS[s.kind].teacher == "strong" for s in chain)
    teacher = ensure_teacher(scale, base, out_root, progress) if strong else None
    previous, key, records = base, base_key(scale), []
    keys = chain_keys(scale, chain)
    for i, (spec, key) in enumerate(zip(chain, keys)):
        label = ".".join(s.label for s in chain[:i + 1])
        out = out_root / "stages" / f"{label}-{key}" / f"seed{seed}"
        config = stage_config(scale, spec, init=previous, seed=seed, base=base, teacher=teacher)
        done_before = (out / DONE_FILE).is_file()
        steps = f"{config.steps} step" + ("s" if config.steps != 1 else "")
        log.info("%s seed %d: stage %d/%d %s %s -> %s", tag, seed, i + 1, len(chain), spec,
                 "(done: reused)" if done_before else f"({steps})", out)
        record = run_stage_cached(spec.kind, config, out, {"name": spec.kind, "harness": spec.harness},
                                  progress=progress, tag=tag)
        cached = done_before and (not tag or record.get("trained_by") != tag)
        records.append(dict(record, dir=str(out), cached=cached))
        previous = out
    return previous, key, records, base_record


def eval_key(scale: Scale) -> str:
    """The digest of the scale's eval config: rows with the same eval key were scored on the same items."""
    return digest(_config_identity(scale.eval))


def eval_dir(key: str, seed: int, scale: Scale, out_root: Path) -> Path:
    """DIR/evals/<key>/seed<k>/<eval-key>/: where `evaluate_cached` writes the evaluation of the checkpoint `key`
    (metrics.json and the per-item `<suite>.jsonl` files)."""
    return out_root / "evals" / key / f"seed{seed}" / eval_key(scale)


def evaluate_cached(checkpoint: Path, key: str, seed: int, scale: Scale, out_root: Path, *,
                    progress: bool = True) -> dict:
    """`hat_jax.eval.evaluate_checkpoint` of `checkpoint`, cached in `eval_dir`/metrics.json. Returns
    {"metrics": ..., "wall_s": ...}."""
    from hat_jax.eval import evaluate_checkpoint

    out = eval_dir(key, seed, scale, out_root)
    done = out / "metrics.json"
    if done.is_file():
        return json.loads(done.read_text())
    log.info("evaluating %s (seed %d) on %s", checkpoint, seed, ", ".join(scale.eval.suites))
    t0 = time.perf_counter()
    metrics = evaluate_checkpoint(checkpoint, scale.eval, out_dir=out, progress=progress)
    result = {"metrics": metrics, "wall_s": round(time.perf_counter() - t0, 3), "checkpoint": str(checkpoint)}
    write_json_atomic(done, result)
    return result
