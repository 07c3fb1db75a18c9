"""Hugging Face checkpoint I/O for qwen3_5_moe: lossless import and export of safetensors folders.

Name mapping (ours -> HF; `P` is `model.` in `Qwen3_5MoeForCausalLM` checkpoints and
`model.language_model.` in the VL `Qwen3_5MoeForConditionalGeneration` ones; transformers 5.23 `modeling_qwen3_5_moe` and vLLM `qwen3_5_mtp` names):
    model/embed_tokens/embedding            P embed_tokens.weight             as is  [V, H]
    model/norm/weight                       P norm.weight                     as is
    lm_head/kernel [H, V]                   lm_head.weight [V, H]             transpose (every Linear)
    .../conv1d/kernel [K, C]                ...conv1d.weight [C, 1, K]
    .../experts/gate_up_proj [E, H, 2I]     fused  ...experts.gate_up_proj [E, 2I, H]  (gate rows first)
                                            or per expert ...experts.{e}.{gate,up}_proj.weight [I, H]
    .../experts/down_proj [E, I, H]         fused  ...experts.down_proj [E, H, I]
                                            or per expert ...experts.{e}.down_proj.weight [H, I]
    mtp/...                                 mtp.{pre_fc_norm_embedding, pre_fc_norm_hidden, fc, layers.0, norm}
Import accepts both prefixes and both expert layouts (main layers and MTP independently), keeps every
tensor's on-disk dtype, and records the layout in `HFLayout` so that export reproduces the source exactly
(names, shapes, dtypes, bytes). `model.visual.*` (the vision tower) is carried aside, never mapped.

Files: only safetensors are read (no pickle: `.bin`/`.pt`/`.pth`/`.ckpt` are refused); sharded folders use
`model.safetensors.index.json`. Export writes tensors directly with safetensors (never via
`transformers.save_pretrained`, which drops `mtp.*` and re-splits experts), sharded with an index when
larger than `max_shard_bytes`, into a temporary folder that is renamed into place.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Iterator, Mapping

import jax
import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)
import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from hat_jax.cache import temp_sibling_dir
from hat_jax.model.config import Qwen3_5MoeTextConfig
from hat_jax.model.params import params_shapes

VISUAL_PREFIX = "model.visual."
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
FLOAT_DTYPES = ("float32", "bfloat16", "float16", "float64")
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "chat_template.json", "vocab.json", "merges.txt", "added_tokens.json")
# Files an export with force=True removes from the output folder before moving its own files in.
REPLACED_FILES = TOKENIZER_FILES + ("config.json", "generation_config.json")


class CheckpointError(ValueError):
    """A checkpoint that cannot be imported: missing/unexpected tensor, wrong shape, bad file."""


@dataclasses.dataclass(frozen=True)
class HFLayout:
    """How a checkpoint stores the text model, so export can reproduce it."""

    prefix: str = "model."                      # or "model.language_model."
    expert_layout: str = "fused"                # main layers: "fused" or "per_expert"
    mtp_expert_layout: str = "per_expert"       # the MTP layer (upstream stores it per expert)


# --------------------------------------------------------------------------------------------------------
# Name mapping
# --------------------------------------------------------------------------------------------------------
def _flatten(tree: dict, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _flatten(value, prefix + (key,))
        else:
            yield prefix + (key,), value


def _set(tree: dict, path: tuple[str, ...], value) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _hf_module_name(path: tuple[str, ...], layout: HFLayout) -> str:
    """Our module path (without the leaf) -> HF dotted module name."""
    parts = list(path)
    if parts[0] == "model":
        head, parts = layout.prefix.rstrip("."), parts[1:]
    elif parts[0] == "mtp":
        head, parts = "mtp", parts[1:]
    else:  # lm_head
        head = ""
    out = [head] if head else []
    for p in parts:
        m = re.fullmatch(r"layers_(\d+)", p)
        out.extend(["layers", m.group(1)] if m else [p])
    return ".".join(out)


def hf_tensor_specs(config: Qwen3_5MoeTextConfig, layout: HFLayout) -> list[tuple[tuple[str, ...], str, dict]]:
    """For every parameter: (our path, kind, {hf_name: hf_shape}). kind is one of
    'copy', 'linear', 'conv', 'gate_up_fused', 'down_fused', 'gate_up_split', 'down_split'."""
    specs = []
    for path, leaf in _flatten(params_shapes(config)):
        module, name = _hf_module_name(path[:-1], layout), path[-1]
        shape = tuple(leaf.shape)
        per_expert = (layout.mtp_expert_layout if path[0] == "mtp" else layout.expert_layout) == "per_expert"
        if name == "gate_up_proj":
            e, h, i2 = shape
            if per_expert:
                names = {f"{module}.{ex}.{p}.weight": (i2 // 2, h) for ex in range(e) for p in ("gate_proj", "up_proj")}
                specs.append((path, "gate_up_split", names))
            else:
                specs.append((path, "gate_up_fused", {f"{module}.gate_up_proj": (e, i2, h)}))
        elif name == "down_proj" and path[-2] == "experts":
            e, i, h = shape
            if per_expert:
                specs.append((path, "down_split", {f"{module}.{ex}.down_proj.weight": (h, i) for ex in range(e)}))
            else:
                specs.append((path, "down_fused", {f"{module}.down_proj": (e, h, i)}))
        elif name == "kernel" and path[-2] == "conv1d":
            specs.append((path, "conv", {f"{module}.weight": (shape[1], 1, shape[0])}))
        elif name == "kernel":
            specs.append((path, "linear", {f"{module}.weight": (shape[1], shape[0])}))
        elif name == "embedding":
            specs.append((path, "copy", {f"{module}.weight": shape}))
        else:  # norm weights, A_log, dt_bias
            specs.append((path, "copy", {f"{module}.{name}": shape}))
    return specs


def _to_ours(kind: str, arrays: list[np.ndarray]) -> np.ndarray:
    if kind == "copy":
        return arrays[0]
    if kind == "linear":
        return np.ascontiguousarray(arrays[0].T)
    if kind == "conv":
        return np.ascontiguousarray(arrays[0][:, 0, :].T)
    if kind == "gate_up_fused":
        return np.ascontiguousarray(np.swapaxes(arrays[0], 1, 2))
    if kind == "down_fused":
        return np.ascontiguousarray(np.swapaxes(arrays[0], 1, 2))
    if kind == "gate_up_split":  # [gate_0, up_0, gate_1, up_1, ...], each [I, H]
        return np.stack([np.concatenate([g.T, u.T], axis=1) for g, u in zip(arrays[0::2], arrays[1::2])])
    if kind == "down_split":
        return np.stack([d.T for d in arrays])
    raise AssertionError(kind)


def _to_hf(kind: str, x: np.ndarray) -> list[np.ndarray]:
    if kind == "copy":
        return [x]
    if kind == "linear":
        return [np.ascontiguousarray(x.T)]
    if kind == "conv":
        return [np.ascontiguousarray(x.T[:, None, :])]
    if kind in ("gate_up_fused", "down_fused"):
        return [np.ascontiguousarray(np.swapaxes(x, 1, 2))]
    if kind == "gate_up_split":
        i = x.shape[2] // 2
        return [np.ascontiguousarray(part) for e in range(x.shape[0]) for part in (x[e, :, :i].T, x[e, :, i:].T)]
    if kind == "down_split":
        return [np.ascontiguousarray(x[e].T) for e in range(x.shape[0])]
    raise AssertionError(kind)


def detect_layout(names: set[str]) -> HFLayout:
    """Infers prefix and expert layouts from tensor names."""
    prefix = "model.language_model." if any(n.startswith("model.language_model.") for n in names) else "model."
    main_fused = any(n.startswith(prefix) and n.endswith("mlp.experts.gate_up_proj") for n in names)
    mtp_fused = any(n.startswith("mtp.") and n.endswith("mlp.experts.gate_up_proj") for n in names)
    return HFLayout(prefix, "fused" if main_fused else "per_expert", "fused" if mtp_fused else "per_expert")


def hf_to_params(tensors: Mapping[str, np.ndarray], config: Qwen3_5MoeTextConfig,
                 layout: HFLayout | None = None) -> tuple[dict, HFLayout, dict[str, np.ndarray]]:
    """Maps HF tensors onto our parameter tree.

    Args:
        tensors: HF name -> numpy array (any dtype; kept as is); a dict or a lazy `read_safetensors` mapping.
        config: the model config (decides which tensors must exist).
        layout: None to detect from the names.
    Returns:
        (params nested dict of numpy arrays, layout, extra tensors kept aside: `model.visual.*`).
    Raises:
        CheckpointError: a missing tensor, an unexpected tensor, a shape mismatch or mixed dtypes inside one
            stacked expert tensor; the message names the tensor (and both shapes).
    """
    layout = layout or detect_layout(set(tensors))
    params: dict = {}
    for path, value in iter_hf_params(tensors, config, layout):
        _set(params, path, value)
    return params, layout, {n: tensors[n] for n in tensors if n.startswith(VISUAL_PREFIX)}


def iter_hf_params(tensors: Mapping[str, np.ndarray], config: Qwen3_5MoeTextConfig,
                   layout: HFLayout) -> Iterator[tuple[tuple[str, ...], np.ndarray]]:
    """(our parameter path, numpy array) for every parameter, one at a time (a lazy mapping reads each tensor
    when its parameter comes); the checks and errors of `hf_to_params`, the unexpected-tensor check last."""
    if config.mtp_num_hidden_layers and not any(n.startswith("mtp.") for n in tensors):
        raise CheckpointError(
            f"the config has mtp_num_hidden_layers={config.mtp_num_hidden_layers} but the checkpoint has no mtp.* "
            f"tensors (transformers' save_pretrained drops them); import it with "
            f"config.replace(mtp_num_hidden_layers=0) to load the main model only")
    used: set[str] = set()
    for path, kind, names in hf_tensor_specs(config, layout):
        arrays = []
        for name, shape in names.items():
            if name not in tensors:
                raise CheckpointError(f"missing tensor {name!r} (expected shape {shape}) for parameter "
                                      f"{'/'.join(path)}")
            arr = tensors[name]
            if tuple(arr.shape) != tuple(shape):
                raise CheckpointError(f"tensor {name!r} has shape {tuple(arr.shape)}, expected {tuple(shape)}")
            arrays.append(arr)
            used.add(name)
        if str(arrays[0].dtype) not in FLOAT_DTYPES:
            raise CheckpointError(f"tensor {next(iter(names))!r} has dtype {arrays[0].dtype}; expected one of "
                                  f"{FLOAT_DTYPES} (quantized checkpoints are not supported: dequantize first)")
        if len({a.dtype for a in arrays}) > 1:
            raise CheckpointError(f"tensors of {'/'.join(path)} mix dtypes {sorted({str(a.dtype) for a in arrays})}")
        yield path, _to_ours(kind, arrays)
    unexpected = sorted(n for n in tensors if n not in used and not n.startswith(VISUAL_PREFIX))
    if unexpected:
        more = f" (and {len(unexpected) - 5} more)" if len(unexpected) > 5 else ""
        raise CheckpointError(f"unexpected tensor(s) {unexpected[:5]}{more}: not part of the qwen3_5_moe text "
                              f"model with this config (num_hidden_layers={config.num_hidden_layers}, "
                              f"num_experts={config.num_experts}, mtp_num_hidden_layers={config.mtp_num_hidden_layers})")


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
    shardings = dict(_flatten(logical_to_mesh(params_logical_axes(config), params_shapes(config), mesh)))
    params: dict = {}
    for path, value in iter_hf_params(tensors, config, layout):
        _set(params, path, jax.make_array_from_callback(value.shape, shardings[path], lambda index: value[index]))
    return params, layout


def params_to_hf(params: dict, config: Qwen3_5MoeTextConfig, layout: HFLayout = HFLayout(),
                 dtype: Any = None) -> dict[str, np.ndarray]:
    """Our parameter tree -> HF name -> numpy array.

    Args:
        params: nested dict of arrays (jax or numpy).
        layout: prefix and expert layouts to write.
        dtype: None keeps each parameter's dtype; otherwise every tensor is cast to it (e.g. 'bfloat16').
    Raises:
        CheckpointError: a parameter of the config is missing from `params`.
    """
    flat = dict(_flatten(params))
    out: dict[str, np.ndarray] = {}
    for path, kind, names in hf_tensor_specs(config, layout):
        if path not in flat:
            raise CheckpointError(f"parameter {'/'.join(path)} missing from the params tree")
        x = np.asarray(jax.device_get(flat[path]))
        if dtype is not None:
            x = x.astype(np.dtype(dtype))
        for name, arr in zip(names, _to_hf(kind, x)):
            out[name] = arr
    return out


# --------------------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------------------
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
    dtypes = [str(np.asarray(x).dtype) for _, x in _flatten(params)]
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
