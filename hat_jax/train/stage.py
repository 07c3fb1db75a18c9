"""Starting, resuming and finishing one training stage's run, shared by SFT, OPD and RL; and their common CLI.

A stage run lives in one directory (`--out`): the `StageCheckpointer` root (checkpoints, model_config.json,
tokenizer/), the TensorBoard run directory (`hat_jax.train.metrics`) and `stage_config.json`. `StageRun`
is that directory's life cycle, in the order every stage uses it:

1. `StageRun(name, out_dir, config_json, resume=..., force=...)`: refuses a directory that already holds
   checkpoints unless resuming (FileExistsError, message names the latest step); `existing` is its latest
   checkpoint step or None (a fresh start). The stage then loads its init, tokenizer and data.
2. `start(model_config, optimizer, mesh, params, seed, param_dtype)`: the abstract train state and its
   shardings (on a mesh), then either the latest checkpoint restored into them (its config hash checked,
   `force` overrides; the mesh is not part of the hash) or a fresh `init_train_state(params, optimizer,
   fold_in(key(seed), 1))` built inside `jit` with those shardings (`hat_jax.train.sharded_init`);
   committed once with `place_state`. Returns (state, data_state); `shardings` is kept for the train step.
3. `run(loop, state, batches, step_fn, ...)`: `stage_config.json` written, then `run_stage` with the stage's
   `StageCheckpointer` and `MetricsWriter` (a fresh run logs its config as the text `config/<name>`), both
   closed on any exit.

The CLI part: the arguments every stage takes (`--preset`, `--out`, `--steps`, `--resume`, `--force`,
`--set`, `--no-progress`), the scale config a stage reads its section from (`--preset NAME` is
`configs/NAME.py`, whose `get_config()` returns the whole scale, as `experiments/run.py --preset NAME` uses it),
`--set key.path=value` overrides (`apply_overrides`), the JSON line a finished run prints and the `__main__`
error handler (exit 2 with `error: <type>: <message>` on stderr).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib.util
import json
import logging
import math
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax

from hat_jax.cache import atomic_dir
from hat_jax.model.params import COMPUTE_DTYPES, params_shapes
from hat_jax.model.sharding import mesh_context
from hat_jax.train import checkpoints as ckpt
from hat_jax.train.distributed import DistributedStartError, add_distributed_args, initialize_from_args, is_primary
from hat_jax.train.metrics import MetricsWriter
from hat_jax.train.optim import OptimConfig
from hat_jax.train.trainer import (LoopConfig, NonFiniteLossError, TrainState, init_train_state, place_state,
                                   run_stage, state_shardings)

CLI_ERRORS = (NonFiniteLossError, ckpt.ConfigMismatchError, ckpt.IncompatibleCheckpointError,
              ckpt.DamagedCheckpointError, DistributedStartError, FileExistsError,
              FileNotFoundError, ValueError)


def check_dtypes(owner: str, **fields) -> None:
    """Raises ValueError naming `owner.field` when a dtype field is not a key of COMPUTE_DTYPES (None passes)."""
    for name, value in fields.items():
        if value is not None and value not in COMPUTE_DTYPES:
            raise ValueError(f"{owner}.{name} = {value!r}; valid: {sorted(COMPUTE_DTYPES)}")


def check_model_options(owner: str, config) -> None:
    """Raises ValueError naming `owner.<field>` when remat_policy is not a `REMAT_POLICIES` key, attention_impl
    not an `ATTENTION_IMPLS` name, moe_impl not a `MOE_IMPLS` name (listing the valid ones) or moe_token_chunk
    neither None nor a positive int."""
    from hat_jax.model.attention import ATTENTION_IMPLS
    from hat_jax.model.moe import MOE_IMPLS
    from hat_jax.model.transformer import check_remat_policy
    check_remat_policy(config.remat_policy, f"{owner}.remat_policy")
    for field, valid in (("attention_impl", ATTENTION_IMPLS), ("moe_impl", MOE_IMPLS)):
        if getattr(config, field) not in valid:
            raise ValueError(f"{owner}.{field} = {getattr(config, field)!r}: expected one of {sorted(valid)}")
    chunk = getattr(config, "moe_token_chunk", None)
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
        raise ValueError(f"{owner}.moe_token_chunk = {chunk!r}: expected None or a positive number of tokens per "
                         f"chunk per device")
    if hasattr(config, "rollout_wave_rows"):
        from hat_jax.rollout.sampler import check_wave_rows
        check_wave_rows(config.rollout_wave_rows, f"{owner}.rollout_wave_rows")


def check_model_overrides(owner: str, config) -> None:
    """Raises ValueError naming `owner.model_overrides` unless it is ((field, value), ...) of distinct
    `Qwen3_5MoeTextConfig` fields that `hat_jax.model.get_config(config.preset, ...)` accepts (the preset named
    too), so a bad override fails when the config is built, not when its stage starts."""
    from hat_jax.model import get_config

    overrides = config.model_overrides
    pairs = isinstance(overrides, (tuple, list)) and all(
        isinstance(p, (tuple, list)) and len(p) == 2 and isinstance(p[0], str) for p in overrides)
    if not pairs:
        raise ValueError(f"{owner}.model_overrides = {overrides!r}: expected ((field, value), ...), e.g. "
                         f'[["vocab_size", 4096], ["hidden_size", 128]] (it replaces the preset\'s overrides; '
                         f"--set model.hidden_size=128 changes one field and keeps the others)")
    fields = [p[0] for p in overrides]
    if len(set(fields)) != len(fields):
        raise ValueError(f"{owner}.model_overrides = {overrides!r}: a field is given twice")
    try:
        get_config(config.preset, **dict(overrides))
    except (TypeError, ValueError, AttributeError, KeyError) as err:  # a value of the wrong kind for its field
        why = str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}"
        raise ValueError(f"{owner}.preset = {config.preset!r} / model_overrides = {overrides!r}: {why}") from None


def model_options(config, *, train: bool = True) -> dict:
    """The `Qwen3_5MoeForCausalLM` keyword options of a stage config: remat_policy and scan_layers (how the
    trained model runs its layers; the defaults of configs without them: no remat, the Python loop),
    attention_impl, moe_impl and moe_token_chunk (which kernels, and in what chunks, compute the same math),
    and router_stats=True (the stages read only the MoE losses' per-layer sums, never the [L, B*T, E] router
    logits: `hat_jax.model.router_stats`). `train=False` (a frozen teacher or reference: forward only) leaves
    remat out."""
    out = {"scan_layers": bool(getattr(config, "scan_layers", False)), "router_stats": True,
           "attention_impl": getattr(config, "attention_impl", "xla"),
           "moe_impl": getattr(config, "moe_impl", "blocked"),
           "moe_token_chunk": getattr(config, "moe_token_chunk", None)}
    if train:
        out["remat_policy"] = getattr(config, "remat_policy", "none")
    return out


def stage_sampler(config, model_config, tokenizer, dtype, bucket: int):
    """The `JaxSampler` of a stage's rollouts (RL episodes, OPD completions): the stage's MoE dispatch
    (`moe_impl`, `moe_token_chunk`) and `rollout_wave_rows` rows per decode call, params given per step
    (`with_params`)."""
    from hat_jax.rollout import JaxSampler
    return JaxSampler(None, model_config, tokenizer, dtype, moe_impl=config.moe_impl, bucket=bucket,
                      moe_token_chunk=config.moe_token_chunk, wave_rows=config.rollout_wave_rows)


def resolved_optim(config) -> OptimConfig:
    """A stage config's `optim` with its schedule's end resolved to the stage's `updates` (`OptimConfig.resolve`)."""
    return config.optim.resolve(config.updates)


def config_json(config) -> dict:
    """A config (a frozen dataclass) as plain JSON data (what is hashed and written); a stage config's `optim` is
    written resolved (`resolved_optim`), so total_steps null and the number it stands for hash alike. The fields
    a config class lists in `OMITTED_AT_DEFAULT` are left out while they hold their default, so a field added
    later does not rename the stages and runs that predate it."""
    data = json.loads(json.dumps(dataclasses.asdict(config), default=str))
    _omit_defaults(config, data)
    if isinstance(getattr(config, "optim", None), OptimConfig):
        data["optim"] = json.loads(json.dumps(dataclasses.asdict(resolved_optim(config))))
    return data


def _omit_defaults(config, data: dict) -> None:
    """Deletes from `data` (`config` as JSON) the `OMITTED_AT_DEFAULT` fields at their default, in nested configs too."""
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if field.name in getattr(config, "OMITTED_AT_DEFAULT", ()):
            default = field.default_factory() if field.default is dataclasses.MISSING else field.default
            if value == default:
                del data[field.name]
                continue
        if dataclasses.is_dataclass(value) and not isinstance(value, type) and isinstance(data.get(field.name), dict):
            _omit_defaults(value, data[field.name])


# ---------------------------------------------------------------------------------------------- the run

class StageRun:
    """One stage's run directory, from the resume check to the closed checkpointer (module docstring).

    Args:
      name: the stage ("sft", "opd", "rl"): the TensorBoard text tag `config/<name>`.
      out_dir: the run directory (resolved). cfg_json: the stage config as JSON (`config_json`).
      resume: continue from the latest checkpoint (a fresh start when there is none). force: resume despite
        a stage-config hash mismatch. logger: where "resumed <out> at step <n>" is logged (the stage's).
    Raises:
      FileExistsError: out_dir already holds checkpoints and resume is False.
      ckpt.DamagedCheckpointError: resuming while a step newer than the latest complete one is damaged (the
        message says which and how to recover).
    """

    def __init__(self, name: str, out_dir: str | Path, cfg_json: dict, *, resume: bool = False, force: bool = False,
                 logger: logging.Logger | None = None):
        self.name, self.cfg_json, self.force = name, cfg_json, force
        self.log = logger or logging.getLogger(__name__)
        self.out = Path(out_dir).resolve()
        if self.out.exists() and not self.out.is_dir():
            raise FileExistsError(f"--out {str(self.out)!r} is a file, not a run directory")
        self.mesh = None  # set by `start`
        self.existing = ckpt.check_resumable(self.out) if resume else ckpt.latest_step(self.out)
        if self.existing is None and resume:
            self.log.debug("resume: %s holds no checkpoint yet; starting from scratch", self.out)
        if self.existing is not None and not resume:
            raise FileExistsError(f"{str(self.out)!r} already holds checkpoints (latest step {self.existing}); pass "
                                  f"--resume to continue, or choose a new --out")
        self.shardings = None
        self.model_config = None

    def start(self, model_config, optimizer, mesh, params, seed: int,
              param_dtype: str = "float32") -> tuple[TrainState, Any]:
        """(state, data_state): the restored latest checkpoint (data_state its stored data state, read straight
        into the mesh's shardings) or a fresh state from `params` (data_state None; params cast to `param_dtype`
        and the optimizer state initialised inside `jit` with the mesh's shardings, `params` donated).
        `stage_config.json` is written by `run`, once the stage has accepted the data state too: a resume refused
        after this point (e.g. `--force` over a changed data layout) leaves the folder's config as it was.

        Raises:
          ckpt.ConfigMismatchError / IncompatibleCheckpointError: see `hat_jax.train.checkpoints`.
        """
        from hat_jax.train.sharded_init import init_state

        self.model_config = model_config
        self.mesh = mesh
        dtype = COMPUTE_DTYPES[param_dtype]
        abstract = jax.eval_shape(lambda: init_train_state(params_shapes(model_config, dtype), optimizer,
                                                           jax.random.key(0)))
        self.shardings = state_shardings(abstract, optimizer, model_config, mesh) if mesh is not None else None
        if self.shardings is not None:
            abstract = jax.tree_util.tree_map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                              abstract, self.shardings)
        data_state = None
        if self.existing is not None:
            state, data_state, _ = ckpt.restore_latest(self.out, abstract, config=self.cfg_json, force=self.force)
            self.log.info("resumed %s at step %d", self.out, self.existing)
        else:
            state = init_state(params, optimizer, jax.random.fold_in(jax.random.key(seed), 1), dtype, self.shardings)
        state = place_state(state, self.shardings)
        return state, data_state

    def run(self, loop: LoopConfig, state: TrainState, batches, step_fn, *, max_to_keep: int,
            prepare: Callable[[Mapping[str, Any]], Mapping[str, jax.Array]],
            data_state: Callable[[], Any] = lambda: None,
            batch_metrics: Callable[[Mapping[str, Any]], dict] | None = None) -> TrainState:
        """`run_stage` with this run's checkpointer and metrics writer (closed on any exit), inside the mesh given
        to `start` (`mesh_context`: the steps traced there constrain their activations to it); the final state.
        With several processes only process 0 writes metrics (`hat_jax.train.distributed.is_primary`); every
        process saves its part of each checkpoint. Process 0 first writes `<out>/stage_config.json`."""
        if is_primary():
            (self.out / "stage_config.json").write_text(json.dumps(self.cfg_json, indent=1, sort_keys=True) + "\n")
        checkpointer = ckpt.StageCheckpointer(self.out, self.cfg_json, self.model_config, max_to_keep=max_to_keep)
        # From scratch (no checkpoint) counts as resuming at step 0: a run killed before its first checkpoint left
        # metrics of steps that are now redone.
        resume_step = 0 if self.existing is None else self.existing
        writer = MetricsWriter(self.out, resume_step=resume_step) if is_primary() else None
        if writer is not None and self.existing is None:
            writer.text(f"config/{self.name}", "```\n" + json.dumps(self.cfg_json, indent=1, sort_keys=True) + "\n```")
        try:
            with mesh_context(self.mesh):
                return run_stage(loop, state, batches, step_fn, prepare=prepare, checkpointer=checkpointer,
                                 data_state=data_state, writer=writer, batch_metrics=batch_metrics)
        finally:
            checkpointer.close()
            if writer is not None:
                writer.close()


def copy_tokenizer(source: Path, target: Path) -> Path:
    """The tokenizer folder a stage loads when `target` (`<out>/tokenizer`) is to hold a copy of `source`: in
    process 0 `target`, after copying `source` there in one rename (`hat_jax.cache.atomic_dir`: a killed copy
    never leaves a partial folder where a resumed run would read it; a folder that exists is kept); `source` in
    the other processes of a multi-process run, which write no run files. `target` itself when source is target.
    """
    if Path(source) == Path(target) or not is_primary():
        return Path(source)
    with atomic_dir(target, clear_stale=True) as tmp:
        shutil.copytree(source, tmp, dirs_exist_ok=True)
    return Path(target)


def check_run_fields(config, names: Sequence[str] = ("steps", "log_every", "ckpt_every", "max_to_keep")) -> None:
    """Called by a stage config's `__post_init__`: each of `names` (those the config has) must be an int >= 1, and
    every field annotated `bool` a bool.

    max_to_keep < 1 would write no checkpoint (a "finished" stage nothing can read), ckpt_every/log_every < 1
    no interval. Raises ValueError naming `<Config>.<field>`, the value and what is expected.
    """
    for name in names:
        if not hasattr(config, name):
            continue
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{type(config).__name__}.{name} = {value!r}: expected an integer >= 1")
    for field in dataclasses.fields(config):  # a switch given None, 0 or "false" would read as another setting
        if field.type in ("bool", bool) and not isinstance(getattr(config, field.name), bool):
            raise ValueError(f"{type(config).__name__}.{field.name} = {getattr(config, field.name)!r}: expected "
                             "true or false")


# ---------------------------------------------------------------------------------------------- --set overrides

FLOAT32_MAX = 3.4028234663852886e38


def parse_value(text: str, current: Any) -> Any:
    """A --set value: JSON (lists become tuples, an int for a float field a float), else the string; for a tuple
    field, text that is not JSON, or a JSON string, is a comma-separated list of strings, in brackets or not
    (`[live_qa,prompt_robustness]`).

    Raises:
      ValueError: a bool/int/float field given another kind of value; a number that is NaN, infinite or
        outside float32's range (it would overflow when the stage casts it).
    """
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = text
    if isinstance(current, tuple) and isinstance(value, str):
        inner = value.strip()
        if inner[:1] + inner[-1:] in ("[]", "()"):
            inner = inner[1:-1]
        value = tuple(v.strip().strip("'\"") for v in inner.split(",") if v.strip())
    if isinstance(current, (int, float)) and isinstance(value, str) and \
            value.strip().lower().lstrip("+-") in ("nan", "inf", "infinity"):
        value = float(value)  # not finite: refused below by what it is, not by its type
    if isinstance(value, float) and not (math.isfinite(value) and abs(value) <= FLOAT32_MAX):
        raise ValueError(f"expected a finite number within float32's range (|x| <= {FLOAT32_MAX:.4g}), got {text!r}")
    if isinstance(value, list):  # config sequences are tuples (hashable, frozen)
        value = tuple(tuple(v) if isinstance(v, list) else v for v in value)
    if isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    for kind in (bool, int, float):  # a number or flag field takes only that kind of value (or null)
        if value is None:
            break
        if isinstance(current, kind) and not (isinstance(value, kind)
                                              and (kind is bool or not isinstance(value, bool))):
            hint = " (true or false)" if kind is bool else ""
            raise ValueError(f"expected a value of type {kind.__name__}{hint}, got {text!r}")
        if isinstance(current, kind):
            break
    return value


def apply_overrides(config, assignments: Sequence[str], *, no_model: str | None = None):
    """`key.path=value` assignments (JSON values, else strings); `model.<field>=v` adds a model override.

    Args:
      no_model: for a stage whose model is its --init checkpoint's: `model.*` keys are refused with this
        message, formatted with `item` (the whole assignment).
    Raises:
        ValueError: malformed assignment or unknown field (lists the valid ones), a refused `model.*` key.
    """
    if no_model is not None:
        for item in assignments:
            if item.split("=", 1)[0].strip().startswith("model."):
                raise ValueError(no_model.format(item=item))
    for item in assignments:
        if "=" not in item:
            raise ValueError(f"--set {item!r}: expected key=value")
        key, text = item.split("=", 1)
        parts = key.strip().split(".")
        if parts[0] == "model" and len(parts) == 2:
            valid = [f.name for f in dataclasses.fields(type(config.model_config()))]
            if parts[1] not in valid:
                raise ValueError(f"--set {key}: unknown model field {parts[1]!r}{did_you_mean(parts[1], valid)}; "
                                 f"valid: {', '.join(valid)}")
            current = getattr(config.model_config(), parts[1])
            overrides = dict(config.model_overrides)
            try:
                overrides[parts[1]] = parse_value(text, current)
            except ValueError as err:
                raise ValueError(f"--set {key}: {err}") from None
            config = dataclasses.replace(config, model_overrides=tuple(sorted(overrides.items())))
            continue
        config = _replace_path(config, parts, text, key)
    return config


def did_you_mean(name: str, valid: Sequence[str]) -> str:
    """' (did you mean 'x'?)' for the closest valid name, '' when none is close."""
    close = difflib.get_close_matches(name, valid, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _replace_path(obj: Any, parts: list[str], text: str, key: str) -> Any:
    if not dataclasses.is_dataclass(obj):
        raise ValueError(f"--set {key}: {type(obj).__name__} has no fields")
    names = [f.name for f in dataclasses.fields(obj)]
    if parts[0] not in names:
        raise ValueError(f"--set {key}: unknown field {parts[0]!r} of {type(obj).__name__}"
                         f"{did_you_mean(parts[0], names)}; valid: {', '.join(names)}")
    current = getattr(obj, parts[0])
    if len(parts) == 1 and dataclasses.is_dataclass(current):
        fields = [f.name for f in dataclasses.fields(current)]
        raise ValueError(f"--set {key}: {parts[0]!r} is a section ({type(current).__name__}), not a value; set one of "
                         f"its fields instead, one --set per field (fields: {', '.join(fields)})")
    if len(parts) > 1:
        value = _replace_path(current, parts[1:], text, key)
    else:
        try:
            value = parse_value(text, current)
        except ValueError as err:
            raise ValueError(f"--set {key}: {err}") from None
    return dataclasses.replace(obj, **{parts[0]: value})


# ---------------------------------------------------------------------------------------------- scale configs

CONFIGS_DIR = Path(__file__).resolve().parents[2] / "configs"


def config_names() -> tuple[str, ...]:
    """The scales of the repository's `configs/` folder, one file each (micro, qwen3_6_35b_a3b, tiny)."""
    return tuple(sorted(p.stem for p in CONFIGS_DIR.glob("*.py") if not p.name.startswith("_")))


def load_config(preset: str):
    """What `get_config()` of a scale config returns (a `hat_jax.experiments.scales.Scale`).

    Args:
      preset: a name in `configs/` (`config_names()`) or the path of a config file ending in .py.
    Raises:
      ValueError: an unknown name (lists the valid ones, with a close match), a file without `get_config()`.
      FileNotFoundError: a .py path that does not exist.
    """
    if not preset.endswith(".py"):
        names = config_names()
        if preset not in names:
            raise ValueError(f"unknown preset {preset!r}{did_you_mean(preset, names)}; valid presets: "
                             f"{', '.join(names)} (or the path of a config file, FILE.py)")
        path = CONFIGS_DIR / f"{preset}.py"
    else:
        path = Path(preset)
        if not path.is_file():
            raise FileNotFoundError(f"scale config {preset!r} does not exist")
    spec = importlib.util.spec_from_file_location(f"hat_jax_scale_config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "get_config", None)):
        raise ValueError(f"scale config {str(path)!r} has no get_config() (it returns the scale's Scale)")
    return module.get_config()


def stage_section(preset: str, section: str):
    """One section of the scale config `preset` (`load_config`): "sft", "rl", "opd", "opd_live", "base.pretrain".

    Raises:
      ValueError: as `load_config`; the scale has no such section, or it is None there (e.g. an imported base).
    """
    value = load_config(preset)
    for part in section.split("."):
        if not hasattr(value, part):
            raise ValueError(f"preset {preset!r}: its config has no section {section!r}")
        value = getattr(value, part)
    if value is None:
        raise ValueError(f"preset {preset!r} has no {section} config to run (its {section} is null there)")
    return value


# ---------------------------------------------------------------------------------------------- the CLI

def stage_parser(module: str, doc: str) -> argparse.ArgumentParser:
    """The parser of `python -m hat_jax.train.<module>` (description: the docstring's first paragraph) with --preset
    (the scale config whose section the stage runs; default micro)."""
    parser = argparse.ArgumentParser(prog=f"python -m hat_jax.train.{module}", description=doc.split("\n\n")[0])
    names = ", ".join(config_names())
    parser.add_argument("--preset", default="micro",
                        help=f"scale config: {names} (configs/NAME.py) or a FILE.py (default micro)")
    return parser


def add_out_steps(parser: argparse.ArgumentParser,
                  steps_help: str = "optimizer steps (also the cosine schedule's end)") -> None:
    parser.add_argument("--out", required=True, help="run directory (checkpoints, metrics, tokenizer)")
    parser.add_argument("--steps", type=int, help=steps_help)


def add_resume_force(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    parser.add_argument("--force", action="store_true", help="resume even if the stage config changed")


def add_set_progress(parser: argparse.ArgumentParser, examples: str) -> None:
    """--set KEY=VALUE (repeatable; `examples` goes into the help) and --no-progress."""
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help=f"override a config field, e.g. {examples}")
    parser.add_argument("--no-progress", action="store_true")


def parse_stage_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parsed arguments (the several-process ones of `hat_jax.train.distributed` added); logging set up at INFO
    for the run, then the run's processes joined when those arguments (or the environment) ask for several.

    Raises:
      ValueError / DistributedStartError: as `hat_jax.train.distributed.initialize_from_args`.
    """
    add_distributed_args(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", force=True)
    logging.getLogger("absl").setLevel(logging.WARNING)  # orbax (absl) set up the root logger first
    initialize_from_args(args)
    return args


def run_options(args: argparse.Namespace) -> dict:
    """resume / force / progress keyword arguments of a stage's run function."""
    return {"resume": args.resume, "force": args.force, "progress": not args.no_progress}


def finish_main(args: argparse.Namespace, state: TrainState) -> int:
    """Prints the run's JSON line ({"run_dir", "step"}) and returns exit status 0."""
    print(json.dumps({"run_dir": str(Path(args.out).resolve()), "step": int(jax.device_get(state.step))}))
    return 0


def enable_compile_cache() -> None:
    """A persistent JAX compilation cache (`$JAX_COMPILATION_CACHE_DIR`, default `<hat-jax cache>/jax`, see
    `hat_jax.data.world_data.cache_root`) for programs that took >= 1 s to compile: a rerun, a resumed run or the
    next stage of a chain loads the sampler and train steps instead of compiling them again. A cache directory
    already set (environment or `jax.config`) is kept."""
    from hat_jax.data.world_data import cache_root

    if jax.config.jax_compilation_cache_dir is None:
        jax.config.update("jax_compilation_cache_dir", str(cache_root() / "jax"))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def cli(main: Callable[[], int], compile_cache: bool = False) -> None:
    """Exits with main()'s status; a stage error exits 2 with `error: <type>: <message>` on stderr.
    `compile_cache`: `enable_compile_cache()` first (the stages' `python -m` entry points)."""
    if compile_cache:
        enable_compile_cache()
    try:
        sys.exit(main())
    except CLI_ERRORS as err:
        print(f"error: {type(err).__name__}: {err}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted: the checkpoints written so far are kept; rerun the same command with --resume to "
              "continue", file=sys.stderr)
        sys.exit(130)
