"""Logical axis names for every parameter, and the one rule table that maps them onto a device mesh.

Every parameter is created with `param_with_axes`, which records logical axis names (Flax
`nn.with_logical_partitioning`). `params_logical_axes` reads them back as a pytree of PartitionSpecs of
logical names; `logical_to_mesh` turns that into `NamedSharding`s on a `Mesh` with the axes
('data', 'fsdp', 'expert', 'tensor', 'context') through `DEFAULT_RULES`. GSPMD inserts the collectives; the
model code itself never mentions devices (the MaxText/Levanter convention).

A logical axis whose dimension does not divide evenly by its mesh axes is an error naming the
parameter, its shape and the mesh (no silent replication).

Activations are constrained by logical names too (`constrain`, MaxText's `with_logical_constraint`): the
batch over every batch axis ('data', 'fsdp', 'expert'; the expert axis holds other tokens outside the MoE
experts, as in MaxText), against the mesh of the surrounding `jax.set_mesh` (`mesh_context`); without a
mesh they are the identity. The 'context' axis splits the sequence ("length") of the [B, T, H] activations
(context parallelism, `hat_jax.model.context_parallel`) and, like fsdp, the dense weights' hidden dim. An
activation dimension that its axes do not divide keeps the longest prefix of
them that does (a batch of 4 rows on fsdp 2 x expert 4 splits over fsdp only).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "expert", "tensor", "context")

# logical axis -> mesh axis (or tuple of mesh axes, or None for replicated)
DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", ("data", "fsdp", "expert")),   # activations and inputs: rows over the batch axes
    ("length", "context"),           # the activations' sequence (context parallelism)
    ("tokens", ("data", "fsdp", "expert", "context")),  # flattened [B*T] tokens: rows, then their sequence
    ("vocab", "tensor"),
    ("embed", ("fsdp", "expert", "context")),   # dense weights' hidden dim: FSDP over fsdp x expert x context
    ("expert_embed", ("fsdp", "context")),      # the experts' hidden dim ('expert' already splits their first dim)
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


def make_mesh(data: int = 1, fsdp: int = 1, expert: int = 1, tensor: int = 1, context: int = 1,
              devices=None) -> Mesh:
    """A Mesh with axes ('data', 'fsdp', 'expert', 'tensor', 'context').

    Raises:
        ValueError: when the product of axis sizes differs from the number of devices.
    """
    devices = jax.devices() if devices is None else list(devices)
    shape = (data, fsdp, expert, tensor, context)
    if math.prod(shape) != len(devices):
        raise ValueError(f"mesh shape data*fsdp*expert*tensor*context={shape} needs {math.prod(shape)} devices, "
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
        bad = indivisible_dim(leaf.shape, spec, mesh.shape)
        if bad is not None:
            dim, mesh_axes, size = bad
            raise ValueError(f"param {jax.tree_util.keystr(path)} shape {leaf.shape}: dimension {dim} is not "
                             f"divisible by mesh axes {mesh_axes} (size {size}) of mesh {dict(mesh.shape)}")
        out.append(NamedSharding(mesh, spec))
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(shapes_tree), out)


def _axes(entry) -> tuple[str, ...]:
    return () if entry is None else entry if isinstance(entry, tuple) else (entry,)


def axes_size(entry, mesh_shape) -> int:
    """Devices along one PartitionSpec entry (None, an axis name or a tuple of them) of a mesh's shape."""
    return math.prod(mesh_shape[a] for a in _axes(entry))


def indivisible_dim(shape: Sequence[int], spec: PartitionSpec, mesh_shape) -> tuple[int, Any, int] | None:
    """(dimension, its mesh axes, their size) of the first dimension of `shape` that `spec` splits unevenly
    on a mesh of `mesh_shape` ({axis: size}), or None when every sharded dimension divides."""
    for dim, entry in zip(shape, spec):
        if entry is not None and dim % axes_size(entry, mesh_shape):
            return dim, entry, axes_size(entry, mesh_shape)
    return None


def fitted_spec(shape: Sequence[int], logical: Sequence[str | None], mesh_shape, rules=DEFAULT_RULES) -> PartitionSpec:
    """`spec_for(logical)` with each dimension's mesh axes cut to the longest prefix whose size divides it,
    and axes of size 1 dropped (a batch of 4 rows on fsdp 2 x expert 4 -> 'fsdp')."""
    out = []
    for dim, entry in zip(shape, spec_for(logical, rules)):
        axes = [a for a in _axes(entry) if mesh_shape.get(a, 1) > 1]
        while axes and dim % axes_size(tuple(axes), mesh_shape):
            axes.pop()
        out.append(None if not axes else axes[0] if len(axes) == 1 else tuple(axes))
    return PartitionSpec(*out)


def mesh_context(mesh: Mesh | None):
    """`jax.set_mesh(mesh)` (the mesh `constrain` and the MoE dispatch read while tracing), or a no-op for None."""
    return contextlib.nullcontext() if mesh is None else jax.set_mesh(mesh)


def active_mesh_shape() -> dict[str, int]:
    """{axis: size} of the mesh in context (`mesh_context`), {} without one."""
    mesh = jax.sharding.get_abstract_mesh()
    return {} if mesh.empty else dict(mesh.shape)


def target_platform() -> str:
    """The platform being compiled for: that of the mesh in context (an AOT compile for TPU devices from a
    CPU host sets one), else `jax.default_backend()`. Usable inside `jit`."""
    mesh = jax.sharding.get_abstract_mesh()
    device = None if mesh.empty else getattr(mesh, "abstract_device", None)
    if device is not None and getattr(device, "platform", None):
        return device.platform
    return jax.default_backend()


def constrain(x: jax.Array, logical: Sequence[str | None], rules=DEFAULT_RULES) -> jax.Array:
    """`jax.lax.with_sharding_constraint` of an activation by logical axis names (`fitted_spec`) against the
    mesh in context; `x` unchanged without a mesh or on one device.

    Args:
        x: any array. logical: one logical name (or None) per dimension of x.
    Raises:
        ValueError: len(logical) != x.ndim, or an unknown logical name.
    """
    if len(logical) != x.ndim:
        raise ValueError(f"constrain: {len(logical)} logical names {tuple(logical)} for an array of shape {x.shape}")
    shape = active_mesh_shape()
    if math.prod(shape.values(), start=1) <= 1:
        return x
    return jax.lax.with_sharding_constraint(x, fitted_spec(x.shape, logical, shape, rules))


def map_row_shards(fn, rows: Sequence[jax.Array], shared: Sequence[jax.Array] = (), logical: str = "batch"):
    """`fn(*rows, *shared)` run by each device on its own rows: a `jax.shard_map` over the mesh axes of
    `logical` ('batch': the batch axes; 'tokens', for flattened [B*T] tokens: those and 'context') that
    divide the rows' leading dimension (`fitted_spec`), `shared` replicated (all-gathered when sharded).
    `fn` must treat rows independently (its result rows depend only on the same input rows) and return one
    array with the rows' leading dimension; then the result equals the plain call. Without a mesh, or when no
    batch axis divides, the plain call. Used for kernels that GSPMD cannot partition (Pallas/Mosaic) and for
    computations whose global form would gather every row (the MoE's sort).

    Args:
        fn: (*rows, *shared) -> [N, ...]. rows: arrays with the same leading dimension N. shared: any arrays.
    Returns:
        fn's [N, ...] result, split over the batch axes like the rows.
    """
    mesh_shape = active_mesh_shape()
    axes = fitted_spec(rows[0].shape[:1], (logical,), mesh_shape)[0] if mesh_shape else None
    if axes is None:
        return fn(*rows, *shared)
    split = PartitionSpec(axes)
    return jax.shard_map(fn, in_specs=(split,) * len(rows) + (PartitionSpec(),) * len(shared), out_specs=split,
                         check_vma=False)(*rows, *shared)


def batch_sharding(mesh: Mesh, ndim: int, rules=DEFAULT_RULES, rows: int | None = None) -> NamedSharding:
    """Sharding for a [B, ...] input: batch over the batch axes ('data', 'fsdp', 'expert'), the rest replicated.
    With `rows` (B), over the longest prefix of them that divides B (`fitted_spec`); without, all of them."""
    logical = ("batch",) + (None,) * (ndim - 1)
    if rows is None:
        return NamedSharding(mesh, spec_for(logical, rules))
    return NamedSharding(mesh, fitted_spec((rows,) + (1,) * (ndim - 1), logical, dict(mesh.shape), rules))


def fully_sharded_shape(devices: int, num_experts: int) -> tuple[int, int, int, int]:
    """(data, fsdp, expert, tensor) = (1, devices / e, e, 1): every parameter sharded over all devices (dense
    weights' hidden dim over fsdp x expert, the experts over expert x fsdp). e is the largest divisor of both
    `devices` and `num_experts` with e * e <= devices (32 chips, 256 experts: fsdp 8 x expert 4)."""
    e = max(d for d in range(1, devices + 1) if devices % d == 0 and num_experts % d == 0 and d * d <= devices)
    return (1, devices // e, e, 1)


def default_mesh(shape: tuple[int, ...] | None = None, num_experts: int = 1) -> Mesh | None:
    """None on one device; else `make_mesh(*shape)` ((data, fsdp, expert, tensor[, context])); without a shape, fully
    sharded over every device (`fully_sharded_shape`: fsdp x expert)."""
    if shape is None:
        if jax.device_count() == 1:
            return None
        shape = fully_sharded_shape(jax.device_count(), num_experts)
    return make_mesh(*shape)


def host_values(tree: Any) -> Any:
    """`jax.device_get(tree)` as numpy; with several processes each array is first gathered whole
    (`multihost_utils.process_allgather`: every process gets every row of a global array, as one process
    would), so host code that reads results (rollouts, reference logprobs) runs the same in every process."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        return multihost_utils.process_allgather(tree, tiled=True)
    return jax.device_get(tree)
