"""Compiles a stage's programs and reads per-chip figures: memory against HBM, FLOPs, collectives.

Per program (`compile_program`): `compiled.memory_analysis()` gives one chip's argument, output, temporary
and aliased (donated) bytes; total = arguments + outputs - aliased + temporaries + the program's resident
bytes (state held on the chip besides the arguments). `compiled.cost_analysis()` gives the chip's FLOPs and
the compiler's time estimate. A program above HBM is refused by the TPU compiler; its report then holds the
bytes the compiler's message states and the message itself (the largest allocations). The collectives are read from the partitioned HLO (`compiled.as_text()`):
count and result bytes per kind (an op inside a loop body is counted once, not per iteration), and the
all-gathers of expert weights among them (`expert_weight_gathers`, by their result shapes).
The stage's peak is its program with the largest total.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from hat_jax.aot.programs import Program
from hat_jax.aot.topology import GiB, Topology
from hat_jax.model.sharding import DEFAULT_RULES, indivisible_dim, mesh_context

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute", "ragged-all-to-all")
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4,
                "f32": 4, "s64": 8, "u64": 8, "f64": 8, "f8e4m3fn": 1, "f8e5m2": 1, "s4": 1, "u4": 1}
_SHAPE = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")
_OP = re.compile(r"=\s*(.*?)\s+(" + "|".join(sorted(COLLECTIVES, key=len, reverse=True)) + r")(-start)?\(")


def check_divisible(program: Program, mesh) -> None:
    """Raises ValueError naming the program, the argument, its shape and the mesh when a sharded dimension
    does not divide by its mesh axes (e.g. a batch of 2 rows on 4 batch devices)."""
    for path, leaf in jax.tree_util.tree_leaves_with_path(program.args):
        spec = getattr(getattr(leaf, "sharding", None), "spec", None)
        bad = None if spec is None else indivisible_dim(leaf.shape, spec, mesh.shape)
        if bad is not None:
            dim, axes, size = bad
            names = (axes,) if isinstance(axes, str) else tuple(axes)
            hint = ("; these are the rows of a micro-batch (the stage's batch size / accum_steps; for generate, "
                    "rl.rollout_wave_rows): give a batch size, accum_steps, wave size or mesh whose rows divide by "
                    f"{size}" if set(names) <= set(dict(DEFAULT_RULES)["batch"]) else "")
            raise ValueError(f"{program.name}: argument {jax.tree_util.keystr(path)} of shape {tuple(leaf.shape)}"
                             f" has dimension {dim}, not divisible by mesh axes {axes} (size {size}) of mesh "
                             f"{dict(mesh.shape)}{hint}")


def _collective_ops(hlo: str):
    """(kind, dtype, dims as ints, the dims text, result bytes) of each collective op line of an HLO module's text
    (asynchronous `-start` ops, whose result is the last shape of their tuple; `-done` halves skipped)."""
    for line in hlo.splitlines():
        m = _OP.search(line)
        if m is None:
            continue
        shapes = _SHAPE.findall(m.group(1))
        if not shapes:
            continue
        dtype, dims = shapes[-1]
        shape = [int(d) for d in dims.split(",") if d]
        yield m.group(2), dtype, shape, dims, _DTYPE_BYTES.get(dtype, 4) * int(np.prod(shape or [1]))


def hlo_collectives(hlo: str) -> dict[str, dict[str, Any]]:
    """{kind: {"count", "bytes" (sum of result sizes), "largest" (bytes), "largest_shape"}} of the collectives
    in an HLO module's text (asynchronous `-start` ops counted, their `-done` halves not; the result of a
    start op is the last shape of its tuple)."""
    out: dict[str, dict[str, Any]] = {}
    for kind, dtype, _, dims, size in _collective_ops(hlo):
        entry = out.setdefault(kind, {"count": 0, "bytes": 0, "largest": 0, "largest_shape": ""})
        entry["count"] += 1
        entry["bytes"] += size
        if size > entry["largest"]:
            entry["largest"], entry["largest_shape"] = size, f"{dtype}[{dims}]"
    return dict(sorted(out.items()))


def expert_weight_shapes(args: Any, mesh_shape: Mapping[str, int]) -> set[tuple[int, ...]]:
    """The shapes an all-gather of expert weights would produce: for every argument leaf under an `experts`
    module, with (E, d1, d2) its last three dimensions, (E', d1', d2') with E' in {E / expert, E} (one
    device's experts, as the expert-parallel dispatch gathers their fsdp part; all of them, as a token-local
    dispatch does) and each d' in {d, d / tensor} (their tensor part gathered or not)."""
    e_axis, t_axis = mesh_shape.get("expert", 1), mesh_shape.get("tensor", 1)
    out: set[tuple[int, ...]] = set()
    for path, leaf in jax.tree_util.tree_leaves_with_path(args):
        if "'experts'" not in jax.tree_util.keystr(path) or len(leaf.shape) < 3:
            continue
        e, d1, d2 = leaf.shape[-3:]
        pick = lambda d: {d, d // t_axis} if d % t_axis == 0 else {d}
        out.update((n, a, b) for n in {e // e_axis, e} for a in pick(d1) for b in pick(d2))
    return out


def expert_weight_gathers(hlo: str, shapes: set[tuple[int, ...]]) -> dict[str, Any]:
    """{"count", "bytes", "largest_shape"} of the all-gathers in an HLO module's text whose result, leading
    1-sized dimensions dropped (a layer of the scanned stack), has one of `shapes` (`expert_weight_shapes`):
    the gathers of expert weights that expert parallelism with the experts' hidden dimension unsharded avoids.
    Static counts (a loop body once), as `hlo_collectives`. A match by shape: at toy sizes another tensor can
    share an expert weight's shape (micro's [2, 32, 64] attention projection on expert 4) and be counted; at
    the real preset's sizes none does."""
    count, total, largest, largest_shape = 0, 0, 0, ""
    for kind, dtype, shape, dims, size in _collective_ops(hlo):
        while len(shape) > 3 and shape[0] == 1:
            shape = shape[1:]
        if kind == "all-gather" and tuple(shape) in shapes:
            count, total = count + 1, total + size
            if size > largest:
                largest, largest_shape = size, f"{dtype}[{dims}]"
    return {"count": count, "bytes": total, "largest_shape": largest_shape}


def _cost(compiled) -> dict:
    cost = compiled.cost_analysis()
    if isinstance(cost, Sequence) and not isinstance(cost, Mapping):
        cost = cost[0] if cost else {}
    return dict(cost or {})


def compile_program(program: Program, topology: Topology, mesh) -> dict[str, Any]:
    """Lowers and compiles one program for the topology's devices; its figures (bytes and FLOPs per chip).

    Returns:
        {"name", "compile_s" (wall), "compile_cpu_s" (this process's CPU time: the figure to compare on a shared
        machine), "bytes_per_chip": {"arguments", "outputs", "temporaries", "aliased", "resident",
        "total"}, "flops_per_chip" (compiler), "analytic_flops_per_chip", "flops_ratio" (compiled / analytic),
        "tokens", "compiler_seconds" (the compiler's step-time estimate, None when it gives none or a
        non-positive one), "collectives" (`hlo_collectives`)}.
    Raises:
        ValueError: an argument that the mesh cannot shard (`check_divisible`).
    """
    check_divisible(program, mesh)
    t0, cpu0 = time.perf_counter(), time.process_time()
    with mesh_context(mesh):  # the activation constraints and the MoE dispatch read it while tracing
        lowered = program.fn.lower(*program.args)
    try:
        compiled = lowered.compile()
    except Exception as err:  # JaxRuntimeError RESOURCE_EXHAUSTED: the compiler refuses a program above HBM
        if "RESOURCE_EXHAUSTED" not in str(err):
            raise
        return _over_hbm(program, topology, str(err), time.perf_counter() - t0)
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - cpu0
    mem = compiled.memory_analysis()
    args, outs = int(mem.argument_size_in_bytes), int(mem.output_size_in_bytes)
    temps, alias = int(mem.temp_size_in_bytes), int(mem.alias_size_in_bytes)
    cost = _cost(compiled)
    flops = float(cost.get("flops", 0.0))
    analytic = program.analytic_flops / topology.chips
    estimate = cost.get("optimal_seconds")
    return {
        "name": program.name,
        "compile_s": round(seconds, 1),
        "compile_cpu_s": round(cpu_seconds, 1),
        "bytes_per_chip": {"arguments": args, "outputs": outs, "temporaries": temps, "aliased": alias,
                           "resident": int(program.resident),
                           "total": args + outs - alias + temps + int(program.resident)},
        "flops_per_chip": flops,
        "analytic_flops_per_chip": analytic,
        "flops_ratio": flops / analytic if analytic else None,
        "tokens": int(program.tokens),
        "compiler_seconds": float(estimate) if estimate is not None and float(estimate) > 0 else None,
        "collectives": hlo_collectives(hlo := compiled.as_text()),
        "expert_weight_all_gathers": expert_weight_gathers(hlo, expert_weight_shapes(program.args,
                                                                                     dict(mesh.shape))),
    }


_SIZE = r"([0-9.]+)([KMGT]?)"
_REQUIRED = (re.compile(r"HLO temporaries \(" + _SIZE + r"\)"), re.compile(r"Used " + _SIZE + r" of"))


def _bytes(number: str, unit: str) -> int:
    return int(float(number) * 1024 ** " KMGT".index(unit or " "))


def _over_hbm(program: Program, topology: Topology, message: str, seconds: float) -> dict[str, Any]:
    """The figures of a program the TPU compiler refused for exceeding HBM: the temporaries (or program bytes) its
    message states, `error` (the message, its allocation list included), no FLOPs or collectives."""
    required = next((m for m in (r.search(message) for r in _REQUIRED) if m), None)
    temps = _bytes(*required.groups()) if required else None
    analytic = program.analytic_flops / topology.chips
    return {
        "name": program.name, "compile_s": round(seconds, 1),
        "bytes_per_chip": {"arguments": None, "outputs": None, "temporaries": temps, "aliased": None,
                           "resident": int(program.resident),
                           "total": None if temps is None else temps + int(program.resident)},
        "flops_per_chip": None, "analytic_flops_per_chip": analytic, "flops_ratio": None,
        "tokens": int(program.tokens), "compiler_seconds": None, "collectives": {},
        "expert_weight_all_gathers": None,
        "error": message.strip()[:4000],
    }


def stage_report(stage: str, topology: Topology, mesh, programs: Sequence[Program], *, preset: str,
                 model: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON report of a stage: the peak program's figures at the top level (`bytes_per_chip`,
    `flops_per_chip`, `analytic_flops_per_chip`, `collectives`), every program under "programs", and
    `fits` (total <= HBM). With the compiler's time estimate for a train step, `mfu` = analytic FLOPs per chip /
    (estimate x peak FLOP/s)."""
    results = [compile_program(p, topology, mesh) for p in programs]
    peak = max(results, key=lambda r: r["bytes_per_chip"]["total"] or float("inf"))
    report = {
        "stage": stage, "preset": preset, "topology": topology.name, "libtpu_topology": topology.libtpu_name,
        "chips": topology.chips, "mesh": dict(mesh.shape), "hbm_bytes_per_chip": topology.hbm_bytes,
        "model": dict(model), "peak_program": peak["name"],
        "bytes_per_chip": peak["bytes_per_chip"], "flops_per_chip": peak["flops_per_chip"],
        "analytic_flops_per_chip": peak["analytic_flops_per_chip"], "collectives": peak["collectives"],
        "fits": all(r["bytes_per_chip"]["total"] is not None and r["bytes_per_chip"]["total"] <= topology.hbm_bytes
                    for r in results),
        "programs": results,
    }
    for r in results:
        if r["compiler_seconds"]:
            r["mfu"] = r["analytic_flops_per_chip"] / (r["compiler_seconds"] * topology.peak_flops_per_s)
    return report


def size(n: float) -> str:
    """Bytes in GiB, or in MiB below 1 GiB (a micro program's figures would all read 0.00 GiB)."""
    return f"{n / GiB:.2f} GiB" if n >= GiB or n == 0 else f"{n / 2**20:.2f} MiB"


def format_report(report: Mapping[str, Any]) -> str:
    """Human-readable lines of a `stage_report` (GiB or MiB, TFLOPs, collective counts and sizes)."""
    hbm = report["hbm_bytes_per_chip"]
    lines = [f"{report['stage']} on {report['topology']} ({report['chips']} chips, mesh "
             + ", ".join(f"{k}={v}" for k, v in report["mesh"].items()) + f"), HBM {hbm / GiB:.1f} GiB per chip"]
    for r in report["programs"]:
        b = r["bytes_per_chip"]
        if "error" in r:
            temps = "?" if b["temporaries"] is None else size(b["temporaries"])
            lines.append(f"  {r['name']}: the compiler refused it after {r['compile_s']:.0f} s: temporaries {temps} "
                         f"per chip exceed the HBM; its message:")
            lines += ["    | " + line for line in r["error"].splitlines()[:40]]
            continue
        lines.append(f"  {r['name']}: compiled in {r['compile_s']:.0f} s ({r['compile_cpu_s']:.0f} s of CPU)")
        lines.append("    per chip: " + ", ".join(f"{k} {size(b[k])}" for k in
                                                  ("arguments", "outputs", "aliased", "temporaries", "resident"))
                     + f" -> total {size(b['total'])} ({100 * b['total'] / hbm:.0f}% of HBM"
                     + (", does NOT fit)" if b["total"] > hbm else ")"))
        ratio = f" (x{r['flops_ratio']:.2f}" if r["flops_ratio"] else ""
        if ratio:  # loops count once and Pallas kernels by their own estimate outside the FLOPs check
            ratio += ")" if report.get("flops_check") else "; comparable only with --flops-check)"
        lines.append(f"    FLOPs per chip: compiled {r['flops_per_chip']:.3e}, analytic "
                     f"{r['analytic_flops_per_chip']:.3e}{ratio}; {r['tokens']:,} tokens per call "
                     f"({r['tokens'] // report['chips']:,} per chip)")
        if r["compiler_seconds"]:
            lines.append(f"    compiler's estimate {r['compiler_seconds']:.3f} s -> MFU {100 * r['mfu']:.1f}%")
        for kind, c in r["collectives"].items():
            lines.append(f"    {kind}: {c['count']} ops, {c['bytes'] / 2**20:.1f} MiB results, largest "
                         f"{c['largest_shape']} ({c['largest'] / 2**20:.1f} MiB)")
        g = r.get("expert_weight_all_gathers")
        if g is not None:
            lines.append(f"    of the all-gathers, of expert weights: {g['count']} ops, {g['bytes'] / 2**20:.1f} MiB"
                         + (f", largest {g['largest_shape']}" if g["count"] else ""))
    return "\n".join(lines)
