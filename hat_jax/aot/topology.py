"""TPU pod-slice names, their chips, HBM and peak FLOP rate, and meshes over the devices libtpu describes.

A slice is named as Cloud TPU names it (`v5p-64`: 64 TensorCores = 32 chips; `v6e-64`: 64 chips) or as
libtpu does (`v5p:4x4x2`). `topology_devices` returns abstract TPU devices (no TPU needed, with
`JAX_PLATFORMS=cpu`) that `jax.jit(...).lower(...).compile()` compiles for.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence

from hat_jax.model.sharding import MESH_AXES

GiB = 1024 ** 3

# generation -> (HBM bytes per chip, bf16 peak FLOP/s per chip, TensorCores per chip in the slice name)
GENERATIONS: dict[str, tuple[int, float, int]] = {
    "v4": (32 * GiB, 275e12, 2),
    "v5e": (16 * GiB, 197e12, 1),
    "v5p": (95 * GiB, 459e12, 2),
    "v6e": (32 * GiB, 918e12, 1),
}

# Cloud TPU slice name -> libtpu topology (chips per dimension)
SLICES: dict[str, str] = {
    **{f"v5p-{2 * n}": f"v5p:{s}" for n, s in ((4, "2x2x1"), (8, "2x2x2"), (16, "2x2x4"), (32, "4x4x2"),
                                                (64, "4x4x4"), (128, "4x4x8"), (256, "4x8x8"), (512, "8x8x8"))},
    **{f"v4-{2 * n}": f"v4:{s}" for n, s in ((4, "2x2x1"), (8, "2x2x2"), (16, "2x2x4"), (32, "2x4x4"),
                                               (64, "4x4x4"))},
    **{f"{g}-{n}": f"{g}:{s}" for g in ("v5e", "v6e")
       for n, s in ((4, "2x2"), (8, "2x4"), (16, "4x4"), (32, "4x8"), (64, "8x8"), (128, "8x16"), (256, "16x16"))},
}


@dataclasses.dataclass(frozen=True)
class Topology:
    """name: as given; libtpu_name: e.g. 'v5p:4x4x2'; generation: 'v5p'; chips; hbm_bytes and
    peak_flops_per_s (bf16) per chip."""

    name: str
    libtpu_name: str
    generation: str
    chips: int
    hbm_bytes: int
    peak_flops_per_s: float


def valid_names() -> list[str]:
    """The slice names `resolve_topology` knows (libtpu also takes '<generation>:<AxBxC>' forms)."""
    return sorted(SLICES, key=lambda s: (s.split("-")[0], int(s.split("-")[1])))


def resolve_topology(name: str) -> Topology:
    """The slice called `name` ('v5p-64' or 'v5p:4x4x2').

    Raises:
        ValueError: an unknown name or generation (lists the valid names).
    """
    libtpu_name = SLICES.get(name, name)
    generation, sep, dims = libtpu_name.partition(":")
    if generation not in GENERATIONS or not sep or not all(d.isdigit() and int(d) > 0 for d in dims.split("x")):
        raise ValueError(f"unknown TPU topology {name!r}; valid: {', '.join(valid_names())} "
                         f"(or libtpu's '<generation>:<AxB[xC]>', generations {', '.join(sorted(GENERATIONS))})")
    hbm, peak, _ = GENERATIONS[generation]
    chips = math.prod(int(d) for d in dims.split("x"))
    return Topology(name, libtpu_name, generation, chips, hbm, peak)


def topology_devices(topology: Topology) -> list:
    """The slice's TPU devices from libtpu (`jax.experimental.topologies.get_topology_desc`).

    Raises:
        RuntimeError: libtpu is missing (install the `tpu-aot` extra) or fails (its message).
        ValueError: libtpu rejects the topology (its message, and the valid names).
    """
    import importlib.util

    from jax.experimental import topologies

    if importlib.util.find_spec("libtpu") is None:
        raise RuntimeError("libtpu is not installed; pip install -e '.[tpu-aot]' (jax[tpu]==0.10.2)")
    # Compile-only: several processes may load libtpu at once (it takes a lock file for a real TPU otherwise).
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    try:
        desc = topologies.get_topology_desc(platform="tpu", topology_name=topology.libtpu_name)
    except Exception as err:  # libtpu raises JaxRuntimeError
        text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if "INVALID_ARGUMENT" in text:
            raise ValueError(f"libtpu rejects TPU topology {topology.name!r} ({text}); valid: "
                             f"{', '.join(valid_names())}") from err
        raise RuntimeError(f"libtpu cannot describe TPU topology {topology.libtpu_name!r}: {text}") from err
    devices = list(desc.devices)
    if len(devices) != topology.chips:
        raise ValueError(f"TPU topology {topology.name!r}: libtpu describes {len(devices)} devices, expected "
                         f"{topology.chips} chips")
    return devices


def parse_mesh(text: str) -> tuple[int, ...]:
    """'data,fsdp,expert,tensor[,context]' sizes, e.g. '1,8,4,1' or '1,8,4,1,2' (context parallelism 2).

    Raises:
        ValueError: not four or five positive integers (names the expected axes).
    """
    parts = [p.strip() for p in text.split(",")]
    if len(parts) not in (len(MESH_AXES) - 1, len(MESH_AXES)) or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"--mesh {text!r}: expected {len(MESH_AXES) - 1} or {len(MESH_AXES)} positive integers "
                         f"{','.join(MESH_AXES)} (context defaults to 1), e.g. 1,8,4,1 or 1,8,4,1,2")
    return tuple(int(p) for p in parts)


def check_mesh(shape: Sequence[int], devices: int) -> None:
    """Raises ValueError naming the mesh and the device count when their sizes differ."""
    if math.prod(shape) != devices:
        named = ", ".join(f"{a}={s}" for a, s in zip(MESH_AXES, shape))
        raise ValueError(f"mesh ({named}) has {math.prod(shape)} devices, the topology {devices}: the sizes' "
                         f"product must equal the chips")
