"""Stage checkpoints: an Orbax `CheckpointManager` holding everything an exact resume needs.

Layout of a run directory (the CheckpointManager root):
    <root>/<step>/params/        ocp.args.StandardSave(params)       (what `load_model_checkpoint` reads)
    <root>/<step>/opt_state/     ocp.args.StandardSave(opt_state)
    <root>/<step>/rng/           JSON {"impl": "threefry2x32", "key_data": [uint32, ...]} (raw key data)
    <root>/<step>/meta/          JSON {"step", "config_hash"}
    <root>/<step>/data_state/    JSON, the Grain iterator's `get_state()` (null when the stage has none)
    <root>/<step>/config/        JSON, the stage config (`config_hash` is the SHA-256 of its canonical JSON)
    <root>/model_config.json     the model's `to_hf_dict()`, so `hat_jax.model.checkpoint_io.load_model_checkpoint`
                                 (and export) read a training run directly
    <root>/tokenizer/            optional, written by the stage
Orbax writes each step into a temporary directory and renames it into place when complete (atomic on a
POSIX file system), so a killed process never leaves a half-written step that `restore_latest` would read;
leftover temporary directories are removed when the manager opens. `max_to_keep` keeps the last N steps.

Restoring reads the latest *complete* step (`hat_jax.model.checkpoint_steps`: Orbax's commit marker and every
item's metadata present and readable); newer damaged steps are named in a logged warning with what to do.
Any error while reading a step (whatever Orbax or TensorStore raise) becomes `DamagedCheckpointError`
naming the step and the recovery (move it aside to resume from the step before). Before reading arrays:
a missing root or a root without steps raises FileNotFoundError naming it; parameters or optimizer leaves
whose shapes/dtypes differ from the stage's abstract state raise `IncompatibleCheckpointError` naming the
checkpoint step directory and the first mismatching leaf; a stored config whose hash differs from the current
one raises `ConfigMismatchError` listing the differing keys unless `force=True`; the mesh is not compared
(`PLACEMENT_FIELDS`): arrays are read straight into the shardings of the abstract state given, so a run
resumes on another mesh, every device reading only its shards.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from hat_jax.cache import write_text_atomic
from hat_jax.model.checkpoint_io import CONFIG_FILE, PARAMS_ITEM
from hat_jax.model.checkpoint_steps import (DamagedCheckpointError, StepScan, first_line, recovery_hint, scan_steps,
                                          silence_abandoned_reads)
from hat_jax.train.trainer import TrainState

ITEMS = (PARAMS_ITEM, "opt_state", "rng", "meta", "data_state", "config")
log = logging.getLogger("hat_jax.checkpoints")


class IncompatibleCheckpointError(ValueError):
    """A checkpoint's parameter/optimizer shapes or structure differ from the stage's model."""


class ConfigMismatchError(ValueError):
    """Resuming with a stage config whose hash differs from the checkpoint's."""


# Top-level stage-config fields that say where and with which kernels a run executes, not what it computes: a
# resume compares the hash of the current config with these fields taken from the stored one, so a run resumes
# on another mesh or backend.
PLACEMENT_FIELDS = ("mesh", "attention_impl", "moe_impl", "moe_token_chunk", "rollout_wave_rows")


def config_hash(config: Mapping[str, Any]) -> str:
    """16 hex digits of the SHA-256 of the config's canonical JSON (sorted keys)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _with_stored_placement(now: Mapping[str, Any], stored: Mapping[str, Any]) -> dict:
    """`now` with the `PLACEMENT_FIELDS` of the stored config (absent ones dropped)."""
    out = {k: v for k, v in now.items() if k not in PLACEMENT_FIELDS}
    out.update({k: stored[k] for k in PLACEMENT_FIELDS if k in stored})
    return out


def _manager(root: Path, max_to_keep: int | None, async_save: bool, read_only: bool = False) -> ocp.CheckpointManager:
    # Readers open the manager with create=False rather than read_only=True (which only logs warnings).
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=not read_only,
                                           cleanup_tmp_directories=not read_only,
                                           enable_async_checkpointing=async_save)
    handlers = {PARAMS_ITEM: ocp.StandardCheckpointHandler(), "opt_state": ocp.StandardCheckpointHandler()}
    handlers.update({name: ocp.JsonCheckpointHandler() for name in ITEMS if name not in handlers})
    return ocp.CheckpointManager(root, options=options, item_handlers=handlers)


class StageCheckpointer:
    """Writes a stage's checkpoints (see the module docstring).

    Args:
        directory: the run directory (created). config: the stage config as a JSON-able dict.
        model_config: the `Qwen3_5MoeTextConfig` (written as model_config.json), or None.
        max_to_keep: steps kept (None = all). async_save: overlap writing with training.
    """

    def __init__(self, directory: str | Path, config: Mapping[str, Any], model_config=None, *,
                 max_to_keep: int | None = 3, async_save: bool = True):
        self.root = Path(directory).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.config = json.loads(json.dumps(config, default=str))
        self.hash = config_hash(self.config)
        if model_config is not None and jax.process_index() == 0:  # Orbax writes the steps from every process
            write_text_atomic(self.root / CONFIG_FILE,
                              json.dumps(model_config.to_hf_dict(), indent=2, sort_keys=True) + "\n")
        self.manager = _manager(self.root, max_to_keep, async_save)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state: TrainState, data_state: Any = None) -> None:
        """Saves `state` as step `step` (asynchronously; `wait()` blocks until it is on disk).

        Raises:
            ValueError: `step` differs from `state.step` (the directory name is the state's step).
        """
        if int(jax.device_get(state.step)) != int(step):
            raise ValueError(f"StageCheckpointer.save: step {step} but state.step is {int(jax.device_get(state.step))}")
        key = jax.device_get(jax.random.key_data(state.rng))
        args = ocp.args.Composite(**{
            PARAMS_ITEM: ocp.args.StandardSave(state.params),
            "opt_state": ocp.args.StandardSave(state.opt_state),
            "rng": ocp.args.JsonSave({"impl": str(jax.random.key_impl(state.rng)), "key_data": np.asarray(key).tolist()}),
            "meta": ocp.args.JsonSave({"step": int(step), "config_hash": self.hash}),
            "data_state": ocp.args.JsonSave(data_state),
            "config": ocp.args.JsonSave(self.config),
        })
        self.manager.save(int(step), args=args, force=True)

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


def _with_default_sharding(tree):
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None) or device), tree)


def check_compatible(where: str, item: str, stored, expected, check_dtype: bool = True) -> None:
    """Raises IncompatibleCheckpointError (naming `where` and the leaf) on the first leaf of `stored` whose
    presence, shape or dtype differs from `expected` (trees of arrays/ShapeDtypeStructs)."""
    got = {_path_name(k): v for k, v in jax.tree_util.tree_leaves_with_path(stored)}
    want = {_path_name(k): v for k, v in jax.tree_util.tree_leaves_with_path(expected)}
    for name in sorted(set(got) | set(want)):
        g, w = got.get(name), want.get(name)
        if g is None or w is None or tuple(g.shape) != tuple(w.shape):
            raise IncompatibleCheckpointError(
                f"checkpoint {where} is incompatible with this stage's model: {item}/{name} has shape "
                f"{tuple(g.shape) if g is not None else 'missing'}, the stage expects "
                f"{tuple(w.shape) if w is not None else 'no such leaf'}")
        if check_dtype and np.dtype(g.dtype) != np.dtype(w.dtype):
            raise IncompatibleCheckpointError(
                f"checkpoint {where}: {item}/{name} has dtype {np.dtype(g.dtype)}, the stage expects {np.dtype(w.dtype)}")


def _path_name(path) -> str:
    """'model/layers_0/mlp/gate/kernel' or '1/0/mu/...': dict keys, attribute names and sequence indices joined
    by '/', so a namedtuple's field and the dict key Orbax stores it under give the same name."""
    parts = []
    for entry in path:
        for attr in ("key", "name", "idx"):
            if hasattr(entry, attr):
                parts.append(str(getattr(entry, attr)))
                break
    return "/".join(parts)


def _config_diff(stored: Mapping[str, Any], current: Mapping[str, Any], prefix: str = "") -> list[str]:
    out = []
    for k in sorted(set(stored) | set(current)):
        a, b = stored.get(k, "<absent>"), current.get(k, "<absent>")
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out += _config_diff(a, b, f"{prefix}{k}.")
        elif a != b:
            out.append(f"{prefix}{k}: checkpoint {a!r} != now {b!r}")
    return out


def latest_step(directory: str | Path) -> int | None:
    """The latest complete step under a run directory (`scan_steps` with every item of `ITEMS`), or None (no
    directory or no complete step)."""
    return scan_steps(directory, ITEMS).latest


def check_resumable(directory: str | Path) -> int | None:
    """The step a resume of `directory` starts from (None: no step at all, a fresh start).

    Raises:
        DamagedCheckpointError: a step newer than the latest complete one is damaged (a resume would write that
            step again over the damaged files) or no step is complete; the message names each damaged step,
            what is wrong and how to recover.
    """
    scan = scan_steps(directory, ITEMS)
    if scan.newer_damaged():
        raise DamagedCheckpointError(scan.warning())
    return scan.latest


def restore_latest(directory: str | Path, abstract_state: TrainState, *, config: Mapping[str, Any] | None = None,
                   force: bool = False, step: int | None = None) -> tuple[TrainState, Any, dict]:
    """Restores the latest (or the given) step of a run directory.

    Args:
        directory: a StageCheckpointer root.
        abstract_state: TrainState of ShapeDtypeStructs (with shardings where the state is sharded), e.g.
            `jax.eval_shape` of the stage's init; rng may be any key (only its position in the tree is used).
        config: the current stage config (JSON-able); when given, its hash must equal the stored one.
        force: resume despite a config-hash mismatch.
        step: a specific step instead of the latest.
    Returns:
        (state, data_state, stored config).
    Raises:
        FileNotFoundError: no such directory, or no checkpoint in it.
        DamagedCheckpointError: the step (or every step) is damaged, or reading it failed in any way (names
            the step, the first line of the error and how to recover).
        IncompatibleCheckpointError: shapes/structure differ (names the step directory and the leaf).
        ConfigMismatchError: config hash differs and not force (lists the differing keys).
    """
    root = Path(directory).resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"checkpoint directory {str(root)!r} does not exist")
    scan = scan_steps(root, ITEMS)
    step = _step_to_restore(root, scan, step)
    where = str(root / str(step))
    manager = _manager(root, None, False, read_only=True)
    silence_abandoned_reads()
    failure = None
    try:
        try:
            small, arrays = _read_step(manager, step, where, abstract_state, config, force)
        except (ConfigMismatchError, IncompatibleCheckpointError):
            raise
        except Exception as err:  # noqa: BLE001 - Orbax/TensorStore raise bare Exception, ValueError, OSError, ...
            failure = f"{type(err).__name__}: {first_line(err)}"
    finally:
        manager.close()
    if failure is not None:  # raised outside the handler: no reference to Orbax's frames or event loop is kept
        raise DamagedCheckpointError(f"checkpoint {where} cannot be read (corrupt or truncated files: {failure}). "
                                     + recovery_hint(root, step, _before(scan.complete, step)))
    log.info("restored step %d of %s", step, root)
    return _train_state(abstract_state, small, arrays), small["data_state"], small["config"]


def _step_to_restore(root: Path, scan: StepScan, step: int | None) -> int:
    """The complete step to read: `step`, or the latest complete one (logging the scan's warning about newer
    damaged steps). Raises DamagedCheckpointError / FileNotFoundError as `restore_latest` says."""
    if step is None:
        step = scan.latest
        if message := scan.warning():
            log.warning("%s", message)
    step = None if step is None else int(step)
    if step is None or step not in scan.complete:
        if step is not None and step in scan.damaged:
            raise DamagedCheckpointError(f"checkpoint {root / str(step)} is damaged ({scan.damaged[step]}). "
                                         + recovery_hint(root, step, _before(scan.complete, step)))
        if step is None and scan.damaged:
            raise DamagedCheckpointError(scan.warning())
        raise FileNotFoundError(f"checkpoint directory {str(root)!r} holds no complete checkpoint"
                                + (f" for step {step}" if step is not None else "")
                                + f" (steps: {list(scan.complete) or 'none'})")
    return step


def _read_step(manager: ocp.CheckpointManager, step: int, where: str, abstract_state: TrainState,
               config: Mapping[str, Any] | None, force: bool) -> tuple[dict, dict]:
    """(the JSON items, the params and opt_state arrays) of `step`: the JSON first, then the config hash and the
    stored shapes are checked before any array is read (ConfigMismatchError, IncompatibleCheckpointError)."""
    small = manager.restore(step, args=ocp.args.Composite(
        meta=ocp.args.JsonRestore(), config=ocp.args.JsonRestore(), data_state=ocp.args.JsonRestore(),
        rng=ocp.args.JsonRestore()))
    if config is not None:
        now = _with_stored_placement(json.loads(json.dumps(config, default=str)), small["config"])
        if config_hash(now) != small["meta"]["config_hash"] and not force:
            diff = _config_diff(small["config"], now) or ["(hash differs)"]
            raise ConfigMismatchError(f"checkpoint {where} was written with another stage config "
                                      f"(hash {small['meta']['config_hash']} vs {config_hash(now)}): "
                                      + "; ".join(diff[:10]) + ". Resume with force=True (--force) to override")
    meta = manager.item_metadata(step)
    for item, expected in ((PARAMS_ITEM, abstract_state.params), ("opt_state", abstract_state.opt_state)):
        stored = meta[item]
        stored = getattr(stored, "tree", stored)
        check_compatible(where, item, _leaf_struct(stored), expected)
    arrays = manager.restore(step, args=ocp.args.Composite(**{  # each device reads its own shards
        PARAMS_ITEM: ocp.args.StandardRestore(_with_default_sharding(abstract_state.params)),
        "opt_state": ocp.args.StandardRestore(_with_default_sharding(abstract_state.opt_state)),
    }))
    return small, arrays


def _train_state(abstract_state: TrainState, small: dict, arrays: dict) -> TrainState:
    """The restored TrainState: the arrays, and the step and rng key from the JSON items placed like
    `abstract_state`'s (when it has shardings)."""
    rng = jax.random.wrap_key_data(np.asarray(small["rng"]["key_data"], np.uint32), impl=small["rng"]["impl"])
    rng_sharding = getattr(abstract_state.rng, "sharding", None)
    if rng_sharding is not None:
        rng = jax.device_put(rng, rng_sharding)
    step_arr = np.asarray(small["meta"]["step"], np.int32)
    step_sharding = getattr(abstract_state.step, "sharding", None)
    step = jax.device_put(step_arr, step_sharding) if step_sharding is not None else jax.numpy.asarray(step_arr)
    return TrainState(arrays[PARAMS_ITEM], arrays["opt_state"], step, rng)


def _before(steps, step: int) -> int | None:
    older = [s for s in steps if s < step]
    return older[-1] if older else None


def _leaf_struct(tree):
    """Orbax metadata tree -> same tree of ShapeDtypeStructs (metadata leaves carry shape and dtype)."""
    return jax.tree_util.tree_map(lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype), tree,
                                  is_leaf=lambda m: hasattr(m, "shape") and hasattr(m, "dtype"))
