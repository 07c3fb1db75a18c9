"""Our qwen3_5_moe parameter tree <-> Hugging Face tensor names and layouts, on arrays in memory.

Name mapping (ours -> HF; `P` is `model.` in `Qwen3_5MoeForCausalLM` checkpoints and
`model.language_model.` in the VL `Qwen3_5MoeForConditionalGeneration` ones; transformers 5.23
`modeling_qwen3_5_moe` and vLLM `qwen3_5_mtp` names):
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
The files themselves (safetensors folders, config.json) are read and written by `hat_jax.model.hf_io`.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Iterator, Mapping

import jax
import numpy as np

from hat_jax.model.config import Qwen3_5MoeTextConfig
from hat_jax.model.params import params_shapes

VISUAL_PREFIX = "model.visual."
FLOAT_DTYPES = ("float32", "bfloat16", "float16", "float64")


class CheckpointError(ValueError):
    """A checkpoint that cannot be imported: missing/unexpected tensor, wrong shape, bad file."""


@dataclasses.dataclass(frozen=True)
class HFLayout:
    """How a checkpoint stores the text model, so export can reproduce it."""

    prefix: str = "model."                      # or "model.language_model."
    expert_layout: str = "fused"                # main layers: "fused" or "per_expert"
    mtp_expert_layout: str = "per_expert"       # the MTP layer (upstream stores it per expert)


def flatten_tree(tree: dict, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """(path of keys, leaf) for every leaf of a nested dict, depth first in key order."""
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from flatten_tree(value, prefix + (key,))
        else:
            yield prefix + (key,), value


def set_leaf(tree: dict, path: tuple[str, ...], value) -> None:
    """Puts `value` at `path` of a nested dict, creating the dicts on the way."""
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
    for path, leaf in flatten_tree(params_shapes(config)):
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
        set_leaf(params, path, value)
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
    flat = dict(flatten_tree(params))
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

