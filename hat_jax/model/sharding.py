"""Logical axis names for every parameter, and the one rule table that maps them onto a device mesh.

Every parameter is created with `param_with_axes`, which records logical axis names (Flax
`nn.with_logical_partitioning`). `params_logical_axes` reads them back as a pytree of PartitionSpecs of
logical names; `logical_to_mesh` turns that into `NamedSharding`s on a `Mesh` with the axes
('data', 'fsdp', 'expert', 'tensor') through `DEFAULT_RULES`. GSPMD inserts the collectives; the
model code itself never mentions devices (the MaxText/Levanter convention).

A logical axis whose dimension does not divide evenly by its mesh axes is an error naming the
parameter, its shape and the mesh (no silent replication).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "expert", "tensor")

# logical axis -> mesh axis (or tuple of mesh axes, or None for replicated)
DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", ("data", "fsdp")),
    ("vocab", "tensor"),
    ("embed", ("fsdp", "expert")),   # dense weights' hidden dim: FSDP over fsdp x expert devices
    ("expert_embed", "fsdp"),        # the experts' hidden dim ('expert' already splits their first dim)
    ("heads", "tensor"),          # attention q/gate/o projections: query heads
    ("kv_heads", "tensor"),       # attention k/v projections
    ("linear_qkv", "tensor"),     # Gated DeltaNet q|k|v channels (conv is depthwise)
    ("linear_v", "tensor"),       # Gated DeltaNet value channels (z gate, out_proj input)
    ("linear_heads", None),       # per-value-head scalars (A_log, dt_bias, beta/decay projections)
    ("mlp", "tensor"),            # expert and shared-expert intermediate
    ("expert", "expert"),
    ("router", None),             # router output (num_experts logits)
    ("norm", None),
    ("conv_kernel", None),
    ("mtp_fc_in", "tensor"),     # MTP fc input: cat[embedding, hidden] (2H); its output is "embed"
)


def param_with_axes(module: nn.Module, name: str, init, shape: Sequence[int], dtype, axes: Sequence[str | None]):
    """Declares a parameter carrying logical axis names; returns the (unboxed) array."""
    if len(axes) != len(shape):
        raise ValueError(f"param {name}: {len(axes)} axis names {tuple(axes)} for shape {tuple(shape)}")
    return module.param(name, nn.with_logical_partitioning(init, tuple(axes)), tuple(shape), dtype)


def make_mesh(data: int = 1, fsdp: int = 1, expert: int = 1, tensor: int = 1, devices=None) -> Mesh:
    """A Mesh with axes ('data', 'fsdp', 'expert', 'tensor').

    Raises:
        ValueError: when the product of axis sizes differs from the number of devices.
    """
    devices = jax.devices() if devices is None else list(devices)
    shape = (data, fsdp, expert, tensor)
    if math.prod(shape) != len(devices):
        raise ValueError(f"mesh shape data*fsdp*expert*tensor={shape} needs {math.prod(shape)} devices, "
                         f"{len(devices)} available")
    return Mesh(np.asarray(devices).reshape(shape), MESH_AXES)


def spec_for(logical: Sequence[str | None], rules=DEFAULT_RULES) -> PartitionSpec:
    """Maps a tuple of logical axis names to a PartitionSpec of mesh axes. Unknown names raise."""
    table = dict(rules)
    out = []
    for name in logical:
        if name is None:
            out.append(None)
            continue
        if name not in table:
            raise ValueError(f"logical axis {name!r} has no rule; known: {sorted(table)}")
        out.append(table[name])
    return PartitionSpec(*out)


def logical_to_mesh(axes_tree, shapes_tree, mesh: Mesh, rules=DEFAULT_RULES):
    """NamedShardings for a params tree.

    Args:
        axes_tree: pytree of PartitionSpec of logical names (from `params_logical_axes`).
        shapes_tree: matching pytree of arrays or ShapeDtypeStructs.
    Raises:
        ValueError: a dimension not divisible by the product of its mesh axes (names the parameter).
    """
    flat_axes = jax.tree_util.tree_flatten_with_path(axes_tree, is_leaf=lambda x: isinstance(x, PartitionSpec))[0]
    flat_shapes = jax.tree_util.tree_leaves(shapes_tree)
    if len(flat_axes) != len(flat_shapes):
        raise ValueError(f"axes tree has {len(flat_axes)} leaves, params tree has {len(flat_shapes)}")
    out = []
    for (path, logical), leaf in zip(flat_axes, flat_shapes):
        spec = spec_for(tuple(logical), rules)
        for dim, mesh_axes in zip(leaf.shape, spec):
            if mesh_axes is None:
                continue
            size = math.prod(mesh.shape[a] for a in (mesh_axes if isinstance(mesh_axes, tuple) else (mesh_axes,)))
            if dim % size:
                raise ValueError(f"param {jax.tree_util.keystr(path)} shape {leaf.shape}: dimension {dim} is not "
                                 f"divisible by mesh axes {mesh_axes} (size {size}) of mesh {dict(mesh.shape)}")
        out.append(NamedSharding(mesh, spec))
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(shapes_tree), out)


def batch_sharding(mesh: Mesh, ndim: int, rules=DEFAULT_RULES) -> NamedSharding:
    """Sharding for a [B, ...] input: batch over ('data', 'fsdp'), the rest replicated."""
    return NamedSharding(mesh, spec_for(("batch",) + (None,) * (ndim - 1), rules))


def fully_sharded_shape(devices: int, num_experts: int) -> tuple[int, int, int, int]:
    """(data, fsdp, expert, tensor) = (1, devices / e, e, 1): every parameter sharded over all devices (dense
    weights' hidden dim over fsdp x expert, the experts over expert x fsdp). e is the largest divisor of both
    `devices` and `num_experts` with e * e <= devices (32 chips, 256 experts: fsdp 8 x expert 4)."""
    e = max(d for d in range(1, devices + 1) if devices % d == 0 and num_experts % d == 0 and d * d <= devices)
    return (1, devices // e, e, 1)


def default_mesh(shape: tuple[int, int, int, int] | None = None, num_experts: int = 1) -> Mesh | None:
    """None on one device; else `make_mesh(*shape)` ((data, fsdp, expert, tensor)); without a shape, fully
    sharded over every device (`fully_sharded_shape`: fsdp x expert)."""
    if shape is None:
        if jax.device_count() == 1:
            return None
        shape = fully_sharded_shape(jax.device_count(), num_experts)
    return make_mesh(*shape)
