"""Which checkpoint a user means by `export/to_hf.py --ckpt PATH` (`resolve_export_source`).

Accepted, in the order they are recognised:
- an experiment dir `DIR/<experiment>` (it has `run_config.json`, `hat_jax.experiments.runner`): the last
  stage of its chain for the seed (default: the first seed of the run), found through `seed<k>.json`,
  `results.json`, or, for a run whose evaluation has not finished, the one
  `DIR/stages/<chain label>-*/seed<k>` directory; a chain without stages (the base row) gives the base;
- `DIR/stages/<chain>-<key>` (seed `--seed`, default the lowest), or a stage dir
  `DIR/stages/<chain>-<key>/seed<k>` (`hat_jax.experiments.chain`); refused while it has no
  `stage_done.json` (the stage is unfinished) unless `allow_unfinished`;
- a model checkpoint (`params/` + `model_config.json`) or a training run dir (an Orbax CheckpointManager
  root: its latest step).
The file names of an experiment's output are the contract with `hat_jax.experiments`.

`recorded_mtp_acceptance` finds the MTP draft acceptance an experiment's evaluation measured on the resolved
checkpoint (results.json's "mtp", `hat_jax.experiments.results`), for `hat_export.json`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from hat_jax.model.checkpoint_io import resolve_checkpoint

# Files of an experiment's output (hat_jax.experiments.chain / runner); their names are the contract.
DONE_FILE, RUN_CONFIG, RESULTS = "stage_done.json", "run_config.json", "results.json"
EXPECTED = ("a model checkpoint (params/ + model_config.json), a training run dir (<step>/params/), an "
            "experiment stage dir DIR/stages/<chain>-<key>/seed<k>, or an experiment dir DIR/<experiment> "
            f"(with {RUN_CONFIG})")


class UnfinishedStageError(ValueError):
    """An experiment stage dir without `stage_done.json`: its stage was interrupted or is still running."""


@dataclasses.dataclass(frozen=True)
class ExportSource:
    """`--ckpt` resolved to one checkpoint.

    directory: what `load_model_checkpoint` reads (a model checkpoint or a CheckpointManager root).
    params_item / config_path: its Orbax params item and model_config.json. step: the CheckpointManager step
    exported (None for a `save_model_checkpoint` directory). kind: 'checkpoint', 'stage' or 'experiment'.
    experiment / stage / seed: when known (`stage` is the stage dir's `<chain>-<key>` name).
    stage_record: the stage's `stage_done.json` (None for an unfinished stage or a plain checkpoint).
    requested: the path as given.
    """

    directory: Path
    params_item: Path
    config_path: Path
    step: int | None
    kind: str
    requested: Path
    experiment: str | None = None
    stage: str | None = None
    seed: int | None = None
    stage_record: dict | None = None

    def describe(self) -> str:
        """One line: what was chosen and why, e.g. for the experiment dir case
        'experiment table6_both, seed 0: its last stage sft-hsa.rl-hsa-d785c0ae26 (step 1): /runs/stages/...'."""
        step = f" (step {self.step})" if self.step is not None else ""
        if self.kind == "experiment":
            return (f"experiment {self.experiment}, seed {self.seed}: its last stage {self.stage}{step}: "
                    f"{self.directory}")
        if self.kind == "stage":
            seed = f", seed {self.seed}" if self.seed is not None else ""
            done = "" if self.stage_record is not None else " UNFINISHED (--allow-unfinished)"
            return f"stage {self.stage}{seed}{step}{done}: {self.directory}"
        return f"checkpoint{step}: {self.directory}"


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: unreadable {what} ({type(err).__name__}: {err})") from err


def _seed_dirs(directory: Path) -> dict[int, Path]:
    return {int(p.name[4:]): p for p in directory.iterdir() if re.fullmatch(r"seed\d+", p.name) and p.is_dir()}


def _latest_step_dir(directory: Path) -> int | None:
    steps = [int(p.name) for p in directory.iterdir() if p.name.isdigit() and (p / "params").is_dir()]
    return max(steps) if steps else None


def _checkpoint(directory: Path, requested: Path, kind: str = "checkpoint", **known) -> ExportSource:
    """The params item of `directory`; FileNotFoundError naming what was expected (and, for an experiments
    output root, the experiment dirs it holds)."""
    try:
        item, config_path = resolve_checkpoint(directory)
    except FileNotFoundError as err:
        experiments = sorted(p.name for p in directory.iterdir() if (p / RUN_CONFIG).is_file()) \
            if directory.is_dir() else []
        hint = (f"; {directory} looks like an experiments output root: pass one experiment dir, e.g. "
                f"{directory / experiments[0]} (found: {', '.join(experiments)})") if experiments else ""
        raise FileNotFoundError(f"--ckpt {requested}: {err}. Expected {EXPECTED}{hint}") from err
    step = int(item.parent.name) if item.parent != directory and item.parent.name.isdigit() else None
    return ExportSource(directory, item, config_path, step, kind, requested, **known)


def _stage(directory: Path, requested: Path, allow_unfinished: bool, kind: str = "stage", **known) -> ExportSource:
    """An experiment stage dir; UnfinishedStageError without its stage_done.json unless allow_unfinished."""
    seed = int(directory.name[4:]) if re.fullmatch(r"seed\d+", directory.name) else None
    label = directory.parent.name if seed is not None else directory.name
    record = None
    if (directory / DONE_FILE).is_file():
        record = _read_json(directory / DONE_FILE, f"stage record ({DONE_FILE})")
    elif not allow_unfinished:
        latest = _latest_step_dir(directory) if directory.is_dir() else None
        planned = ""
        if (directory / "stage_config.json").is_file():
            steps = _read_json(directory / "stage_config.json", "stage config").get("steps")
            planned = f" of {steps}" if steps is not None else ""
        at = f"its latest checkpoint is step {latest}{planned}" if latest is not None else "it has no checkpoint yet"
        raise UnfinishedStageError(
            f"--ckpt {requested}: the stage {directory} is unfinished (no {DONE_FILE}; {at}). Finish it with "
            f"`python experiments/run.py --exp <experiment> --resume` (same --out, --preset and --set), or pass "
            f"--allow-unfinished to export its latest checkpoint anyway")
    known = {"stage": label, "seed": seed, **known}
    return _checkpoint(directory, requested, kind, stage_record=record, **known)


def _experiment_stage_dir(root: Path, run_config: dict, seed: int) -> Path:
    """The directory of the last stage of `root`'s chain for `seed` (module docstring)."""
    name = run_config.get("experiment", root.name)
    recorded = None
    if (root / f"seed{seed}.json").is_file():
        recorded = _read_json(root / f"seed{seed}.json", "seed record").get("checkpoint")
    elif (root / RESULTS).is_file():
        stages = _read_json(root / RESULTS, "results").get("stages") or []
        seeds = [int(s) for s in run_config.get("seeds", [])]
        if stages and seed in seeds:
            recorded = stages[-1]["dirs"][seeds.index(seed)]
    if recorded is not None:
        path = Path(recorded)
        moved = root.parent / "stages" / path.parent.name / path.name   # the output root was moved or copied
        return path if path.exists() or not moved.exists() else moved
    chain = run_config.get("chain") or []
    if not chain:
        raise FileNotFoundError(f"--ckpt {root}: experiment {name} has no stages (it evaluates the base) and no "
                                f"seed{seed}.json naming the base checkpoint; export the base checkpoint directly")
    label = ".".join(str(s).replace(":", "-") for s in chain)   # StageSpec "kind:variant" -> label "kind-variant"
    candidates = sorted(root.parent.glob(f"stages/{label}-*/seed{seed}"))
    if len(candidates) == 1:
        return candidates[0]
    raise FileNotFoundError(
        f"--ckpt {root}: experiment {name} has no seed{seed}.json or {RESULTS} yet, and {len(candidates)} dirs, not "
        f"exactly one, match its last stage {root.parent}/stages/{label}-*/seed{seed} "
        f"({', '.join(map(str, candidates)) or 'none'}); pass the stage dir itself")


def resolve_export_source(ckpt: str | Path, seed: int | None = None, allow_unfinished: bool = False) -> ExportSource:
    """Resolves `--ckpt` (a checkpoint, a run dir, a stage dir or an experiment dir; module docstring).

    Args:
        seed: for an experiment dir or a `stages/<chain>-<key>` dir: which seed (default: the first of the
            run, or the lowest seed dir). Refused for other kinds of directory.
        allow_unfinished: export a stage dir that has no stage_done.json (its latest checkpoint).
    Raises:
        FileNotFoundError: a missing path, or no params item / model_config.json where one is expected (the
            message names the path and the accepted layouts). UnfinishedStageError: an unfinished stage.
        ValueError: an unreadable run_config/seed/stage record, or a seed the run does not have.
    """
    requested = Path(ckpt)
    root = requested.resolve()
    if not root.is_dir():
        what = "is a file, not a directory" if root.exists() else "does not exist"
        raise FileNotFoundError(f"--ckpt {requested} {what}; expected {EXPECTED}")
    if (root / RUN_CONFIG).is_file():
        run_config = _read_json(root / RUN_CONFIG, "experiment run config")
        seeds = [int(s) for s in run_config.get("seeds", [])]
        if seed is None:
            if not seeds:
                raise ValueError(f"{root / RUN_CONFIG}: lists no seeds; pass --seed")
            seed = seeds[0]
        elif seeds and seed not in seeds:
            raise ValueError(f"--seed {seed}: experiment {run_config.get('experiment', root.name)} ({root}) was run "
                             f"with seeds {seeds}")
        stage_dir = _experiment_stage_dir(root, run_config, seed)
        name = run_config.get("experiment", root.name)
        if not run_config.get("chain"):    # the row evaluates the base itself (e.g. the cached tiny base)
            return _checkpoint(stage_dir, requested, "experiment", experiment=name, stage="base", seed=seed)
        return _stage(stage_dir, requested, allow_unfinished, kind="experiment", experiment=name)
    seed_dirs = _seed_dirs(root)
    if seed_dirs and not (root / "params").is_dir() and _latest_step_dir(root) is None:   # stages/<chain>-<key>
        chosen = min(seed_dirs) if seed is None else seed
        if chosen not in seed_dirs:
            raise ValueError(f"--seed {seed}: {root} has seed dirs {sorted(seed_dirs)}")
        return _stage(seed_dirs[chosen], requested, allow_unfinished)
    if seed is not None:
        raise ValueError(f"--seed applies to an experiment dir or DIR/stages/<chain>-<key>; {requested} is neither")
    in_stages = re.fullmatch(r"seed\d+", root.name) and root.parent.parent.name == "stages"
    if in_stages or (root / DONE_FILE).is_file():
        return _stage(root, requested, allow_unfinished)
    return _checkpoint(root, requested)


def _same_checkpoint(recorded: str | None, directory: Path) -> bool:
    """Whether a results.json checkpoint path names `directory`: the same path, or the same
    `<chain>-<key>/seed<k>` tail (an output root that was moved or copied; the key hashes the stage's identity)."""
    if not recorded:
        return False
    path = Path(recorded)
    return path == directory or (path.parent.name, path.name) == (directory.parent.name, directory.name)


def _results_candidates(source: ExportSource) -> list[Path]:
    """The results.json files that may hold figures of `source`: its experiment dir's, or for a stage dir
    DIR/stages/<chain>-<key>/seed<k> every DIR/<experiment>/results.json."""
    if source.kind == "experiment":
        return [source.requested.resolve() / RESULTS]
    if source.kind == "stage" and source.directory.parent.parent.name == "stages":
        return sorted(source.directory.parent.parent.parent.glob(f"*/{RESULTS}"))
    return []


def recorded_mtp_acceptance(source: ExportSource) -> tuple[dict | None, str | None]:
    """The MTP draft acceptance measured on exactly the checkpoint of `source`, from a results.json.

    Only a finished stage's figures count (the evaluation scored its final checkpoint, which is what is
    exported), or a base row's; the seed and the checkpoint path of results.json's `mtp.per_seed` entry must be
    the source's.
    Returns:
        ({"acceptance_depth1": share in [0, 1], "mean_accepted_length", "positions", "episodes", "seed",
          "checkpoint", "experiment", "results": the results.json path}, None), or (None, the reason there are
        none: a plain checkpoint, an unfinished stage, no results.json, or none with figures of it).
    Raises:
        ValueError: an unreadable results.json.
    """
    if source.kind == "checkpoint":
        return None, ("the exported source is a model checkpoint or training run dir, not an experiment or stage "
                      "dir: no results.json to read (experiments/benchmarks/mtp_acceptance.py --ckpt measures it)")
    if source.stage_record is None and source.stage != "base":     # a base row's checkpoint has no stage record
        return None, f"the stage {source.directory} is unfinished: no evaluation scored this checkpoint"
    candidates = [p for p in _results_candidates(source) if p.is_file()]
    if not candidates:
        return None, f"no {RESULTS} found for {source.directory} (its experiment's evaluation has not finished)"
    for path in candidates:
        data = _read_json(path, "results")
        for entry in (data.get("mtp") or {}).get("per_seed") or []:
            if entry.get("seed") == source.seed and _same_checkpoint(entry.get("checkpoint"), source.directory) \
                    and entry.get("acceptance_depth1") is not None:
                return {**{k: entry[k] for k in ("acceptance_depth1", "mean_accepted_length", "positions",
                                                   "episodes", "seed", "checkpoint")},
                        "experiment": data.get("experiment"), "results": str(path)}, None
    where = ", ".join(map(str, candidates))
    return None, (f"{where} holds no MTP acceptance of seed {source.seed} of {source.directory} (measured by the "
                  f"evaluation only when the model has an MTP block and eval.mtp_items > 0)")
