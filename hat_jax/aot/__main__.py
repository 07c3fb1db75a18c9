"""Compile a stage's jitted programs for a TPU pod slice on this machine and report per-chip memory and FLOPs.

    python -m hat_jax.aot --preset qwen3_6_35b_a3b --topology v5p-64 --stage sft|opd|rl|generate
        [--mesh data,fsdp,expert,tensor[,context]] [--set sft.data.seq_len=4096 --set model.num_hidden_layers=4 ...]
        [--json FILE] [--flops-check [--flops-seq-len 4096]]

Needs libtpu (`pip install -e ".[tpu-aot]"`); run with JAX_PLATFORMS=cpu (nothing runs on a TPU). `--set`
takes the experiment presets' `section.field=value` (`hat_jax.experiments.scales`) and `model.<field>=value`
for the model of every stage. The mesh: --mesh, else the stage config's `mesh`, else
`hat_jax.model.sharding.fully_sharded_shape` for the slice.
`--flops-check` compiles the SFT step at a shape whose compiled FLOPs are comparable with the analytic count
(`hat_jax.aot.programs.flops_check_assignments`), after the `--set` assignments.
Prints the figures (`hat_jax.aot.report.format_report`); exit 2 with `error: ...` on bad input.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before jax is imported: compile for TPU, run nothing on one

from hat_jax.aot.programs import FLOPS_SEQ_LEN, STAGES, flops_check_assignments, stage_model_config, stage_programs
from hat_jax.aot.report import format_report, stage_report
from hat_jax.aot.topology import check_mesh, parse_mesh, resolve_topology, topology_devices, valid_names
from hat_jax.cache import write_text_atomic
from hat_jax.cli_types import positive_int


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    from hat_jax.experiments.scales import SCALES

    parser = argparse.ArgumentParser(prog="python -m hat_jax.aot", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="qwen3_6_35b_a3b",
                        help=f"experiment preset: {', '.join(SCALES)} (default qwen3_6_35b_a3b: a 35B compile takes "
                             "5-15 minutes and ~12 GiB of memory)")
    parser.add_argument("--topology", required=True, help=f"TPU slice: {', '.join(valid_names())} or libtpu's "
                                                          "'v5p:4x4x2' form")
    parser.add_argument("--stage", required=True, choices=STAGES)
    parser.add_argument("--mesh", help="data,fsdp,expert,tensor[,context] sizes whose product is the chips (default: "
                                       "the stage's `mesh` field when "
                                       "set, e.g. --set sft.mesh=[1,1,32,1], else fsdp x expert over every chip)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="section.field=value of the preset (sft.data.seq_len=4096, rl.accum_steps=8) or "
                             "model.<field>=value (model.num_hidden_layers=4)")
    parser.add_argument("--json", help="also write the report as JSON to FILE")
    parser.add_argument("--flops-check", action="store_true",
                        help="sft only: one row of --flops-seq-len tokens per batch device, no remat, full logits, "
                             "XLA attention (compiled FLOPs comparable with the analytic count)")
    parser.add_argument("--flops-seq-len", type=positive_int,
                        help="with --flops-check: its row length (default 4096)")
    args = parser.parse_args(argv)
    if args.flops_seq_len is not None and not args.flops_check:
        parser.error("--flops-seq-len: only with --flops-check (it sets the FLOPs check's row length)")
    return args


def split_model_overrides(assignments: Sequence[str]) -> tuple[list[tuple[str, object]], list[str]]:
    """(model.<field> overrides as (field, value), the other assignments); values parsed as JSON when they are.

    Raises:
        ValueError: a model.* assignment without '=' or a field.
    """
    model, rest = [], []
    for item in assignments:
        key, sep, value = item.partition("=")
        if not key.strip().startswith("model."):
            rest.append(item)
            continue
        field = key.strip()[len("model."):]
        if not sep or not field:
            raise ValueError(f"--set {item!r}: expected model.<field>=value")
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            parsed = value
        model.append((field, tuple(parsed) if isinstance(parsed, list) else parsed))
    return model, rest


def run(args: argparse.Namespace) -> dict:
    """Builds, compiles and reports (module docstring); returns the report dict."""
    from hat_jax.experiments.scales import apply_scale_overrides, get_scale
    from hat_jax.model.sharding import fully_sharded_shape, make_mesh

    topology = resolve_topology(args.topology)
    model_overrides, rest = split_model_overrides(args.set)
    scale = apply_scale_overrides(get_scale(args.preset), rest)
    model_config = stage_model_config(args.stage, scale, model_overrides)
    section = "rl" if args.stage == "generate" else args.stage
    configured = getattr(scale, section).mesh
    if args.mesh and configured is not None and tuple(parse_mesh(args.mesh)) != tuple(configured):
        raise ValueError(f"--mesh {args.mesh} and {section}.mesh = {list(configured)} disagree: give one of them")
    if args.mesh:
        shape = parse_mesh(args.mesh)
    elif configured is not None:
        shape = tuple(configured)
    else:
        shape = fully_sharded_shape(topology.chips, model_config.num_experts)
    check_mesh(shape, topology.chips)
    flops_seq_len = (args.flops_seq_len or FLOPS_SEQ_LEN) if args.flops_check else None
    if args.flops_check:
        scale = apply_scale_overrides(scale, flops_check_assignments(args.stage, shape[0] * shape[1] * shape[2],
                                                                     flops_seq_len))
    devices = topology_devices(topology)
    mesh = make_mesh(*shape, devices=devices)
    programs = stage_programs(args.stage, scale, model_config, mesh, flops_check=args.flops_check)
    model = {"layers": model_config.num_hidden_layers, "hidden_size": model_config.hidden_size,
             "num_experts": model_config.num_experts, "vocab_size": model_config.vocab_size}
    report = stage_report(args.stage, topology, mesh, programs, preset=args.preset, model=model)
    report["flops_check"] = bool(args.flops_check)
    report["flops_seq_len"] = flops_seq_len
    report["assignments"] = list(args.set)
    return report


def check_json_target(path: str) -> None:
    """Raises ValueError when the report could not be written to `path` (a folder, or a folder that cannot be
    made or written): checked before a compile that takes minutes."""
    target = Path(path)
    if target.is_dir():
        raise ValueError(f"--json {path}: is a folder; expected a file path")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"--json {path}: cannot create its folder ({err})") from err
    try:  # a real write: permission bits do not tell for root or for /proc-like folders
        with tempfile.TemporaryFile(dir=target.parent):
            pass
    except OSError as err:
        raise ValueError(f"--json {path}: its folder {target.parent} is not writable ({err})") from err


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.json:  # before compiling: a 35B compile takes minutes
        check_json_target(args.json)
    report = run(args)
    print(format_report(report))
    if args.json:
        write_text_atomic(args.json, json.dumps(report, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (ValueError, RuntimeError) as err:
        print(f"error: {type(err).__name__}: {err}", file=sys.stderr)
        sys.exit(2)
