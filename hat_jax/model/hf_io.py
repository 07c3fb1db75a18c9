"""Hugging Face checkpoint folders for qwen3_5_moe: lossless import and export of safetensors + config.json.

Files: only safetensors are read (no pickle: `.bin`/`.pt`/`.pth`/`.ckpt` are refused); sharded folders use
`model.safetensors.index.json`. Export writes tensors directly with safetensors (never via
`transformers.save_pretrained`, which drops `mtp.*` and re-splits experts), sharded with an index when
larger than `max_shard_bytes`, into a temporary folder that is renamed into place. The tensor names and
layouts (both prefixes, both expert layouts, `HFLayout`) are `hat_jax.model.hf_mapping`'s.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any, Mapping

import jax
import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)
import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from hat_jax.cache import temp_sibling_dir
from hat_jax.model.config import Qwen3_5MoeTextConfig
from hat_jax.model.hf_mapping import (VISUAL_PREFIX, CheckpointError, HFLayout, detect_layout, flatten_tree,
                                      hf_to_params, iter_hf_params, params_to_hf, set_leaf)
from hat_jax.model.params import params_shapes

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "chat_template.json", "vocab.json", "merges.txt", "added_tokens.json")
# Files an export with force=True removes from the output folder before moving its own files in.
REPLACED_FILES = TOKENIZER_FILES + ("config.json", "generation_config.json")


def _refuse_pickles(directory: Path) -> None:
    pickles = sorted(p.name for p in directory.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise CheckpointError(f"{directory}: found non-safetensors weight files {pickles}; only safetensors are "
                              f"loaded (pickle files can run arbitrary code). Convert them to safetensors first.")


def safetensors_files(directory: str | os.PathLike) -> list[Path]:
    """The weight files of a folder: from the index when present, else `model.safetensors`.

    Raises:
        CheckpointError: no safetensors file, a pickle weight file, or an index naming a missing file.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: not a directory")
    index = directory / INDEX_FILE
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise CheckpointError(f"{index}: not a valid safetensors index ({e})") from e
        files = [directory / f for f in sorted(set(weight_map.values()))]
        missing = [str(f) for f in files if not f.exists()]
        if missing:
            raise CheckpointError(f"{index} names missing shard(s) {missing}")
        return files
    if (directory / SINGLE_FILE).exists():
        return [directory / SINGLE_FILE]
    _refuse_pickles(directory)
    found = sorted(directory.glob("*.safetensors"))
    if not found:
        raise CheckpointError(f"{directory}: no {SINGLE_FILE} or {INDEX_FILE} found")
    return found


class LazyTensors(Mapping):
    """Read-only mapping name -> numpy array over the files of a safetensors folder; a tensor is read from
    disk when it is looked up, so importing holds one copy of the weights, not two."""

    def __init__(self, files: list[Path]):
        self._handles, self._file_of = {}, {}
        for f in files:
            try:
                handle = safe_open(str(f), framework="np")
            except (SafetensorError, OSError, ValueError) as e:
                raise CheckpointError(f"{f}: cannot read safetensors file (corrupt or truncated?): {e}") from e
            self._handles[f] = handle
            for name in handle.keys():
                if name in self._file_of:
                    raise CheckpointError(f"tensor {name!r} appears in more than one file ({f.name})")
                self._file_of[name] = f

    def __getitem__(self, name: str) -> np.ndarray:
        f = self._file_of[name]
        try:
            return self._handles[f].get_tensor(name)
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(f"{f}: cannot read tensor {name!r} (corrupt or truncated file?): {e}") from e

    def __iter__(self):
        return iter(self._file_of)

    def __len__(self) -> int:
        return len(self._file_of)


def read_safetensors(directory: str | os.PathLike, lazy: bool = False) -> Mapping[str, np.ndarray]:
    """The tensors of a safetensors folder as numpy arrays (bfloat16 via ml_dtypes).

    Args:
        lazy: return a `LazyTensors` mapping (tensors read on lookup) instead of a dict of all tensors.
    Raises:
        CheckpointError: corrupt or truncated file (names it), duplicate tensor names, pickle files.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: not a directory")
    _refuse_pickles(directory)
    tensors = LazyTensors(safetensors_files(directory))
    return tensors if lazy else {name: tensors[name] for name in tensors}


def stream_hf_params(directory: str | os.PathLike, config: Qwen3_5MoeTextConfig, mesh) -> tuple[dict, HFLayout]:
    """The safetensors folder's params placed straight into `mesh`'s shardings one tensor at a time: each is read,
    converted, and each process copies only its devices' shards (`jax.make_array_from_callback`) before the next
    is read, so host RAM holds about one tensor (the largest: a layer's stacked experts), not the model.

    Returns:
        (params: nested dict of jax.Arrays with on-disk dtypes, sharded by `hat_jax.model.sharding`, layout).
    Raises:
        CheckpointError: as `hf_to_params` (a bad folder, tensor or shape; names it). ValueError: a mesh that
            cannot shard a parameter (names it).
    """
    from hat_jax.model.params import params_logical_axes
    from hat_jax.model.sharding import logical_to_mesh

    tensors = read_safetensors(directory, lazy=True)
    layout = detect_layout(set(tensors))
    shardings = dict(flatten_tree(logical_to_mesh(params_logical_axes(config), params_shapes(config), mesh)))
    params: dict = {}
    for path, value in iter_hf_params(tensors, config, layout):
        set_leaf(params, path, jax.make_array_from_callback(value.shape, shardings[path], lambda index: value[index]))
    return params, layout


def load_hf_checkpoint(directory: str | os.PathLike) -> tuple[Qwen3_5MoeTextConfig, dict, HFLayout]:
    """Reads `config.json` + safetensors of a qwen3_5_moe checkpoint (text or VL layout).

    Returns:
        (config, params as a nested dict of numpy arrays with on-disk dtypes, layout).
    Raises:
        CheckpointError / ValueError: missing config.json, wrong model_type, bad tensors (see hf_to_params).
    """
    directory = Path(directory)
    cfg_file = directory / "config.json"
    if not cfg_file.exists():
        raise CheckpointError(f"{directory}: no config.json")
    config = read_hf_config(cfg_file)
    params, layout, _ = hf_to_params(read_safetensors(directory, lazy=True), config)
    return config, params, layout


def read_hf_config(path: str | os.PathLike) -> Qwen3_5MoeTextConfig:
    """Our config from a `config.json` (text or VL wrapper).

    Raises:
        CheckpointError: unreadable JSON, wrong model_type or an invalid field (the message names the file).
    """
    try:
        return Qwen3_5MoeTextConfig.from_hf_dict(json.loads(Path(path).read_text()))
    except (OSError, json.JSONDecodeError, TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: not a valid qwen3_5_moe config.json: {e}") from e


# Fields that do not change the tensors or the math of the main model; everything else must agree between
# the model being exported and a drop-in source's config.json. (Whether `mtp.*` is written follows the
# params; the source's config.json is kept as it is, e.g. a transformers-saved folder that says
# mtp_num_hidden_layers=1 but has no mtp.* tensors round-trips exactly.)
_NON_ARCHITECTURE_FIELDS = ("extra", "pad_token_id", "bos_token_id", "eos_token_id", "max_position_embeddings",
                            "initializer_range", "router_aux_loss_coef", "output_router_logits",
                            "attention_dropout", "full_attention_interval", "mtp_num_hidden_layers")


def architecture_differences(a: Qwen3_5MoeTextConfig, b: Qwen3_5MoeTextConfig) -> list[str]:
    """'field: a_value vs b_value' for every field that changes the tensors or the math (not the ids or the
    metadata in `_NON_ARCHITECTURE_FIELDS`); empty when `a` and `b` describe the same model."""
    return [f"{f.name}: {getattr(a, f.name)!r} vs {getattr(b, f.name)!r}" for f in dataclasses.fields(a)
            if f.name not in _NON_ARCHITECTURE_FIELDS and getattr(a, f.name) != getattr(b, f.name)]


def _shards(tensors: dict[str, np.ndarray], max_shard_bytes: int) -> list[dict[str, np.ndarray]]:
    shards, current, size = [], {}, 0
    for name in sorted(tensors):
        nbytes = tensors[name].nbytes
        if current and size + nbytes > max_shard_bytes:
            shards.append(current)
            current, size = {}, 0
        current[name] = tensors[name]
        size += nbytes
    if current:
        shards.append(current)
    return shards


def write_safetensors(tensors: dict[str, np.ndarray], directory: str | os.PathLike,
                      max_shard_bytes: int = 5 * 2**30) -> list[str]:
    """Writes `model.safetensors`, or `model-0000i-of-0000n.safetensors` shards + index when the total is
    larger than `max_shard_bytes`. Returns the file names written."""
    directory = Path(directory)
    shards = _shards(tensors, max_shard_bytes)
    metadata = {"format": "pt"}
    if len(shards) == 1:
        save_file(shards[0], str(directory / SINGLE_FILE), metadata=metadata)
        return [SINGLE_FILE]
    names, weight_map = [], {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(directory / fname), metadata=metadata)
        names.append(fname)
        weight_map.update({k: fname for k in shard})
    index = {"metadata": {"total_size": int(sum(t.nbytes for t in tensors.values()))}, "weight_map": weight_map}
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return names + [INDEX_FILE]


def _dtype_name(params: dict, dtype: Any) -> str:
    if dtype is not None:
        return str(np.dtype(dtype))
    dtypes = [str(np.asarray(x).dtype) for _, x in flatten_tree(params)]
    return max(set(dtypes), key=dtypes.count)


def text_config_json(config: Qwen3_5MoeTextConfig, torch_dtype: str) -> dict:
    """`config.json` of the text-only layout (`Qwen3_5MoeForCausalLM`, model_type `qwen3_5_moe_text`)."""
    d = config.to_hf_dict()
    d["architectures"] = ["Qwen3_5MoeForCausalLM"]
    d["model_type"] = "qwen3_5_moe_text"
    d["mtp_num_hidden_layers"] = config.mtp_num_hidden_layers
    d["dtype"] = torch_dtype
    return dict(sorted(d.items()))


def save_hf_checkpoint(params: dict, config: Qwen3_5MoeTextConfig, out_dir: str | os.PathLike, *,
                       layout: str = "text", source: str | os.PathLike | None = None, dtype: Any = None,
                       expert_layout: str = "fused", tokenizer_dir: str | os.PathLike | None = None,
                       generation_config: dict | None = None, max_shard_bytes: int = 5 * 2**30,
                       force: bool = False) -> list[str]:
    """Writes a servable HF folder.

    Args:
        layout: 'text' — `Qwen3_5MoeForCausalLM` keys `model.*`, `lm_head.weight`, `mtp.*` (main experts in
            `expert_layout`, MTP experts per expert as upstream); 'dropin' — the layout of `source` (a HF
            folder): its `config.json` kept byte for byte, its prefix and expert layouts reproduced, and its
            `model.visual.*` tensors copied unchanged.
        source: HF folder for 'dropin' (required) and the default tokenizer source for both layouts.
        dtype: None keeps each parameter's dtype; e.g. 'bfloat16' casts all text-model tensors.
        tokenizer_dir: folder whose tokenizer files are copied byte for byte (default: `source`).
        generation_config: written as generation_config.json when given; otherwise the tokenizer folder's
            (or the source's) generation_config.json is copied when there is one.
        force: allow writing into a non-empty `out_dir` (its old weight files are removed).
    Returns:
        The file names written.
    Raises:
        FileExistsError: `out_dir` is not empty and `force` is False.
        CheckpointError: bad `layout`, missing `source` for 'dropin', a bad source checkpoint, or a source
            whose config.json describes a different architecture than `config`. Nothing is written then.
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise FileExistsError(f"{out_dir} exists and is a file; expected a new or existing directory")
    if out_dir.exists() and any(out_dir.iterdir()) and not force:
        raise FileExistsError(f"{out_dir} is not empty; pass force=True (--force) to overwrite")
    if layout not in ("text", "dropin"):
        raise CheckpointError(f"layout {layout!r}: expected 'text' or 'dropin'")
    if expert_layout not in ("fused", "per_expert"):
        raise CheckpointError(f"expert_layout {expert_layout!r}: expected 'fused' or 'per_expert'")
    source = Path(source) if source is not None else None
    if layout == "dropin":
        if source is None:
            raise CheckpointError("layout 'dropin' needs source=HF_BASE_DIR (its config.json and vision weights)")
        diffs = architecture_differences(config, read_hf_config(source / "config.json"))
        if diffs:
            raise CheckpointError(f"{source}/config.json describes a different model than the params "
                                  f"(ours vs source): {'; '.join(diffs)}")
        source_tensors = read_safetensors(source, lazy=True)
        hf_layout = detect_layout(set(source_tensors))
        tensors = params_to_hf(params, config, hf_layout, dtype)
        tensors.update({n: source_tensors[n] for n in source_tensors if n.startswith(VISUAL_PREFIX)})
    else:
        tensors = params_to_hf(params, config, HFLayout("model.", expert_layout, "per_expert"), dtype)
    # clear_stale: the partial folders an export that was killed left
    with temp_sibling_dir(out_dir, clear_stale=True) as tmp:
        written = write_safetensors(tensors, tmp, max_shard_bytes)
        if layout == "dropin":
            shutil.copyfile(source / "config.json", tmp / "config.json")
        else:
            cfg = text_config_json(config, _dtype_name(params, dtype))
            (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        written.append("config.json")
        if generation_config is not None:
            (tmp / "generation_config.json").write_text(json.dumps(generation_config, indent=2) + "\n")
            written.append("generation_config.json")
        tok_src = Path(tokenizer_dir) if tokenizer_dir is not None else source
        if tok_src is not None:
            for name in TOKENIZER_FILES + ("generation_config.json",):
                if (tok_src / name).exists() and not (tmp / name).exists():
                    shutil.copyfile(tok_src / name, tmp / name)
                    written.append(name)
        for name in written:
            os.chmod(tmp / name, 0o644)   # safetensors writes 0600; a server may run as another user
        out_dir.mkdir(parents=True, exist_ok=True)
        for old in out_dir.iterdir():     # force: drop every model file of the previous export
            if old.is_file() and (old.suffix in (".safetensors",) + PICKLE_SUFFIXES or old.name in REPLACED_FILES
                                  or old.name.endswith(".index.json")):
                old.unlink()
        for name in written:
            os.replace(tmp / name, out_dir / name)
    return written
