"""Model checkpoints on disk (Orbax) for inference: parameters plus the model config, nothing else.

Layouts that `load_model_checkpoint` reads:

1. A model checkpoint, as written by `save_model_checkpoint`:
       <dir>/model_config.json      config.to_hf_dict() (a `qwen3_5_moe_text` config.json)
       <dir>/params/                the params pytree, an `ocp.StandardCheckpointer` directory
       <dir>/tokenizer/             optional, a Hugging Face tokenizer folder (used by `hat_jax.generate`)
2. An Orbax `CheckpointManager` root, as the trainer writes it:
       <root>/<step>/params/        an item named 'params' saved with `ocp.args.StandardSave(params)`
       <root>/<step>/...            other items (optimizer state, ...), ignored here
       <root>/model_config.json     or <root>/<step>/model_config.json (the step's copy wins)
       <root>/tokenizer/            optional
   The latest complete step (`hat_jax.model.checkpoint_steps`: commit marker and every item's metadata
   present and readable) is used; newer damaged steps are named in a logged warning with what to do, and a
   root whose steps are all damaged raises `DamagedCheckpointError`. Orbax's temporary directories (names
   that are not integers) are ignored. The step read is logged ("hat_jax.checkpoints", INFO).
3. One step of such a root, `<root>/<step>` (an earlier step than the latest): its params, and the config of
   the step or of the root.

Parameters are restored with the dtypes and shapes stored in the checkpoint (checked against the config's
parameter shapes before any array is read), onto the default device, straight into a mesh's shardings, or
into host memory; the stored sharding is ignored, so a checkpoint written on an accelerator loads on CPU.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp

from hat_jax.model.checkpoint_steps import (DamagedCheckpointError, first_line, recovery_hint, scan_steps,
                                          silence_abandoned_reads)
from hat_jax.model.config import Qwen3_5MoeTextConfig
from hat_jax.model.hf_io import read_hf_config
from hat_jax.model.params import params_shapes


class _MissingMetadataFilter(logging.Filter):
    """Drops Orbax's "Metadata file does not exist" warning, logged for every checkpoint written or read
    without the optional metadata file (harmless: the tree structure is read from the checkpoint itself);
    other Orbax messages pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Metadata file does not exist")


logging.getLogger("absl").addFilter(_MissingMetadataFilter())

CONFIG_FILE = "model_config.json"
PARAMS_ITEM = "params"


def save_model_checkpoint(directory: str | Path, params: dict, config: Qwen3_5MoeTextConfig) -> Path:
    """Writes `<directory>/params` (Orbax) and `<directory>/model_config.json`; returns the directory.

    Args:
        directory: created if missing. params: the model params pytree (any dtypes). config: the model config.
    Raises:
        FileExistsError: `<directory>/params` already exists. ValueError: params do not match the config.
    """
    root = Path(directory).resolve()
    if (root / PARAMS_ITEM).exists():
        raise FileExistsError(f"{root / PARAMS_ITEM} already exists; choose a new checkpoint directory")
    _check_shapes(params, params_shapes(config), root)
    root.mkdir(parents=True, exist_ok=True)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(root / PARAMS_ITEM, params)
    checkpointer.wait_until_finished()
    checkpointer.close()
    (root / CONFIG_FILE).write_text(json.dumps(config.to_hf_dict(), indent=2, sort_keys=True) + "\n")
    return root


def _is_params_item(path: Path) -> bool:
    return path.is_dir() and (path / "_METADATA").is_file()


def _latest_params_item(root: Path) -> Path:
    """`<root>/<latest complete step>/params` of a CheckpointManager root (module docstring)."""
    scan = scan_steps(root, (PARAMS_ITEM,))
    if message := scan.warning():
        logging.getLogger("hat_jax.checkpoints").warning("%s", message)
    if scan.latest is None:
        if scan.damaged:
            bad = max(scan.damaged)
            raise DamagedCheckpointError(f"checkpoint directory {str(root)!r} has no complete step: "
                                         + "; ".join(f"step {s}: {w}" for s, w in sorted(scan.damaged.items()))
                                         + f". {recovery_hint(root, bad, None)}")
        raise FileNotFoundError(
            f"checkpoint directory {str(root)!r} has no Orbax params item: expected {root / PARAMS_ITEM} "
            f"(save_model_checkpoint) or <step>/{PARAMS_ITEM} under a CheckpointManager root (found steps: none)")
    return root / str(scan.latest) / PARAMS_ITEM


def resolve_checkpoint(directory: str | Path) -> tuple[Path, Path]:
    """Finds the params item and the config file of a model checkpoint or CheckpointManager root.

    Returns:
        (params item directory, model_config.json path).
    Raises:
        FileNotFoundError: the directory, a params item, or model_config.json is missing (the message names
            the path and the layouts expected, see the module docstring).
        DamagedCheckpointError: a CheckpointManager root whose step directories are all damaged.
    """
    root = Path(directory).resolve()
    if not root.is_dir():
        what = "is a file, not a directory" if root.exists() else "does not exist"
        raise FileNotFoundError(f"checkpoint directory {str(root)!r} {what}")
    if _is_params_item(root / PARAMS_ITEM):
        item = root / PARAMS_ITEM
    else:
        item = _latest_params_item(root)
    step_of_root = item.parent == root and root.name.isdigit()
    for config_path in (item.parent / CONFIG_FILE, root / CONFIG_FILE) + ((root.parent / CONFIG_FILE,) if step_of_root else ()):
        if config_path.is_file():
            return item, config_path
    places = str(item.parent) if item.parent == root else f"{item.parent} or {root}"
    raise FileNotFoundError(f"checkpoint {str(root)!r}: no {CONFIG_FILE} in {places}")


def load_model_checkpoint(directory: str | Path, *, mesh=None, host: bool = False
                          ) -> tuple[Qwen3_5MoeTextConfig, dict]:
    """Loads (config, params) from a model checkpoint or a CheckpointManager root (module docstring).

    Args:
        mesh: a `jax.sharding.Mesh`: every parameter is read straight into its `hat_jax.model.sharding`
            NamedSharding on it (each device reads its own shards; no device holds a full copy). None: onto
            the default device.
        host: read into host numpy arrays instead (no device memory; export), ignoring `mesh`.
    Returns:
        (config, params) with params a nested dict of jax.Arrays (numpy arrays with `host`) in their stored dtypes.
    Raises:
        FileNotFoundError: missing directory, params item or config (see `resolve_checkpoint`).
        DamagedCheckpointError (a ValueError): unreadable/corrupt params (names the step and how to recover).
        ValueError: an unreadable config, params that do not match the config's shapes (the message names the
            path and the first mismatching parameter), or a mesh that cannot shard a parameter (names the
            parameter, its shape and the mesh).
    """
    item, config_path = resolve_checkpoint(directory)
    config = read_hf_config(config_path)
    checkpointer = ocp.Checkpointer(ocp.StandardCheckpointHandler())  # synchronous: nothing to overlap
    silence_abandoned_reads()
    failure = None
    try:
        stored = checkpointer.metadata(item).item_metadata
        if stored is None:
            raise ValueError("no readable Orbax metadata")
        stored = jax.tree_util.tree_map(lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype), stored.tree)
    except Exception as err:  # noqa: BLE001 - Orbax/TensorStore raise many types (a bare Exception too)
        failure = f"{type(err).__name__}: {first_line(err)}"
    if failure is None:
        try:
            _check_shapes(stored, params_shapes(config), item)  # before reading any array
            target = _restore_target(stored, config, mesh, host, item)
        except Exception:
            checkpointer.close()
            raise
        try:
            params = checkpointer.restore(item, target)
        except Exception as err:  # noqa: BLE001 - as above
            failure = f"{type(err).__name__}: {first_line(err)}"
    checkpointer.close()
    if failure is not None:  # raised outside the handler: no reference to Orbax's frames or event loop is kept
        hint = ""
        if item.parent.name.isdigit():
            older = [s for s in scan_steps(item.parent.parent, (PARAMS_ITEM,)).complete if s < int(item.parent.name)]
            hint = ". " + recovery_hint(item.parent.parent, int(item.parent.name), older[-1] if older else None)
        raise DamagedCheckpointError(f"could not read the Orbax params item {str(item)!r} (corrupt, truncated or "
                                     f"not a params checkpoint): {failure}{hint}")
    where = f"step {item.parent.name} of {item.parent.parent}" if item.parent.name.isdigit() else str(item.parent)
    logging.getLogger("hat_jax.checkpoints").info("loaded the params of %s", where)
    return config, params


def _restore_target(stored: dict, config: Qwen3_5MoeTextConfig, mesh, host: bool, item: Path):
    """What Orbax restores into: numpy arrays (host), ShapeDtypeStructs sharded on the mesh, or on device 0."""
    if host:
        return jax.tree_util.tree_map(lambda s: np.empty(s.shape, s.dtype), stored)
    if mesh is None:
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        return jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=device), stored)
    from hat_jax.model.params import params_logical_axes
    from hat_jax.model.sharding import logical_to_mesh

    try:
        shardings = logical_to_mesh(params_logical_axes(config), stored, mesh)
    except ValueError as err:
        raise ValueError(f"checkpoint {str(item)!r} cannot be restored onto this mesh: {err}") from None
    return jax.tree_util.tree_map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), stored, shardings)


def _check_shapes(params: dict, expected: dict, item: Path) -> None:
    got = {jax.tree_util.keystr(k): v.shape for k, v in jax.tree_util.tree_leaves_with_path(params)}
    want = {jax.tree_util.keystr(k): v.shape for k, v in jax.tree_util.tree_leaves_with_path(expected)}
    for name in sorted(set(got) | set(want)):
        if got.get(name) != want.get(name):
            raise ValueError(f"params for {str(item)!r} do not match the model config: {name} has shape "
                             f"{got.get(name, 'missing')}, the config expects {want.get(name, 'no such parameter')}")
