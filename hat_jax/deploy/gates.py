"""The three release gates: 15 s latency, no business regression, no loss of general capability.

    python -m hat_jax.deploy.gates --replay runs/replay/replay.json --eval runs/table3_hat/results.json \\
        --baseline runs/table3_base/results.json [--config gates.yaml] [--json gates.json]

Variant implemented and why (the HAT report's release gates; thresholds are ours, in `gates.yaml`
beside this module, since the paper names the gates but not their tolerances):
- latency: for every gated concurrency level of the replay report (`latency.concurrency`, default
  1 and 2, the paper's 1-2 concurrent requests per replica), P95 wall latency <= `p95_max_s` and
  the share of all measured requests that succeeded within 15 s >= `within_15s_min`;
- business: the candidate's Live QA AVG (`metrics.live_qa.avg` of its results.json) >= the
  baseline's minus `business.tolerance` points;
- general: IFE-P (`metrics.ifeval.prompt_strict`) when both results have IFEval, else the
  in-domain IFEval-style gauge (`metrics.ifeval_mini.prompt_strict`, what the tiny scale always
  has), candidate >= baseline minus `general.tolerance`.
A `--config` file overrides any subset of the defaults; unknown keys are errors. The policy and
harness versions of the replay are printed with the table (and kept in `--json`).
Exit status: 0 all gates pass, 1 a gate fails, 2 bad input (a missing file or field, named).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

DEFAULT_CONFIG = Path(__file__).with_name("gates.yaml")
CONFIG_KEYS = {
    "latency": {"p95_max_s": float, "within_15s_min": float, "concurrency": list},
    "business": {"tolerance": float},
    "general": {"tolerance": float},
}


class GateInputError(ValueError):
    """A gate input file is missing, unreadable, or lacks a field (the message names both)."""


def load_config(path: str | Path | None = None) -> dict[str, dict[str, Any]]:
    """The gate thresholds: `gates.yaml` beside this module, overridden by `path` when given.

    Raises:
      GateInputError: unreadable YAML, an unknown section or key, or a value of the wrong type.
    """
    config = _read_yaml(DEFAULT_CONFIG)
    if path is not None:
        override = _read_yaml(Path(path))
        for section, values in override.items():
            if section not in CONFIG_KEYS:
                raise GateInputError(f"{path}: unknown section {section!r}; expected one of {sorted(CONFIG_KEYS)}")
            if not isinstance(values, Mapping):
                raise GateInputError(f"{path}: {section} must be a mapping, got {type(values).__name__}")
            config[section] = {**config[section], **values}
    for section, keys in CONFIG_KEYS.items():
        for key, value in config.get(section, {}).items():
            where = f"{path or DEFAULT_CONFIG}: {section}.{key}"
            if key not in keys:
                raise GateInputError(f"{where}: unknown key; expected one of {sorted(keys)}")
            if keys[key] is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise GateInputError(f"{where} = {value!r}: expected a number")
            if keys[key] is list and (not isinstance(value, list) or not value
                                      or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in value)):
                raise GateInputError(f"{where} = {value!r}: expected a non-empty list of ints >= 1")
        missing = set(keys) - set(config.get(section, {}))
        if missing:
            raise GateInputError(f"{path or DEFAULT_CONFIG}: {section} lacks {sorted(missing)}")
    return config


def _read_yaml(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise GateInputError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    except yaml.YAMLError as exc:
        raise GateInputError(f"{path}: not valid YAML ({exc})") from exc
    if not isinstance(data, dict):
        raise GateInputError(f"{path}: expected a mapping of sections, got {type(data).__name__}")
    return data


def read_json(path: str | Path, what: str) -> dict:
    """The JSON object in `path`; GateInputError naming `what` (e.g. "--replay") and the file otherwise."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise GateInputError(f"{what} {path}: cannot read ({exc.strerror or exc})") from exc
    except ValueError as exc:
        raise GateInputError(f"{what} {path}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise GateInputError(f"{what} {path}: expected a JSON object")
    return data


def _number(data: Mapping[str, Any], dotted: str, where: str, allow_null: bool = False) -> float | None:
    node: Any = data
    for i, part in enumerate(parts := dotted.split(".")):
        if node is None:
            raise GateInputError(f"{where}: field {'.'.join(parts[:i])!r} is null, so {dotted!r} is missing")
        if not isinstance(node, Mapping) or part not in node:
            raise GateInputError(f"{where}: missing field {dotted!r}")
        node = node[part]
    if node is None and allow_null:
        return None
    if isinstance(node, bool) or not isinstance(node, (int, float)):
        raise GateInputError(f"{where}: field {dotted!r} = {node!r}; expected a number")
    return float(node)


def latency_gate(replay: Mapping[str, Any], config: Mapping[str, Any], where: str = "replay") -> dict[str, Any]:
    """The latency gate row from a replay report (`hat_jax.deploy.replay`); GateInputError on missing fields."""
    levels = replay.get("levels")
    if not isinstance(levels, list):
        raise GateInputError(f"{where}: missing field 'levels' (is it a replay.json?)")
    by_c = {lv.get("concurrency"): lv for lv in levels if isinstance(lv, Mapping)}
    parts, ok = [], True
    for c in config["concurrency"]:
        if c not in by_c:
            raise GateInputError(f"{where}: no concurrency level {c} (has {sorted(by_c)}); run the replay with it "
                                 "or set latency.concurrency in --config")  # fmt: skip
        s = by_c[c].get("summary")
        if not isinstance(s, Mapping):
            raise GateInputError(f"{where}: levels[C={c}] lacks 'summary'")
        p95 = _number(s, "p95_wall_s", f"{where} levels[C={c}].summary", allow_null=True)
        share = _number(s, "within_15s", f"{where} levels[C={c}].summary", allow_null=True)
        ok &= p95 is not None and p95 <= config["p95_max_s"] and share is not None and share >= config["within_15s_min"]
        parts.append(f"C={c}: P95 {'-' if p95 is None else f'{p95:.3f}'} s, ≤15 s "
                     f"{'-' if share is None else f'{100 * share:.1f}%'}")  # fmt: skip
    levels_text = ", ".join(str(c) for c in config["concurrency"])
    threshold = f"P95 ≤ {config['p95_max_s']:g} s and ≤15 s ≥ {100 * config['within_15s_min']:g}% at C={levels_text}"
    return {"gate": "latency", "measured": "; ".join(parts), "threshold": threshold, "passed": bool(ok)}


def business_gate(candidate: Mapping, baseline: Mapping, config: Mapping, where: tuple[str, str]) -> dict[str, Any]:
    """The business gate row: Live QA AVG not below the baseline's minus the tolerance."""
    cand = _number(candidate, "metrics.live_qa.avg", where[0])
    base = _number(baseline, "metrics.live_qa.avg", where[1])
    floor = base - config["tolerance"]
    return {"gate": "business", "measured": f"Live QA AVG {cand:.2f} (baseline {base:.2f})", "passed": cand >= floor,
            "threshold": f"≥ {floor:.2f} (baseline - {config['tolerance']:g})"}


def general_gate(candidate: Mapping, baseline: Mapping, config: Mapping, where: tuple[str, str]) -> dict[str, Any]:
    """The general-capability gate row: IFE-P if both results have IFEval, else the ifeval_mini gauge."""
    both = all(isinstance(r.get("metrics"), Mapping) and r["metrics"].get("ifeval") is not None
               for r in (candidate, baseline))  # fmt: skip
    path, label = "metrics.ifeval.prompt_strict", "IFE-P"
    if not both:
        path, label = "metrics.ifeval_mini.prompt_strict", "IF-mini prompt strict"
    cand, base = _number(candidate, path, where[0]), _number(baseline, path, where[1])
    floor = base - config["tolerance"]
    return {"gate": "general", "measured": f"{label} {cand:.2f} (baseline {base:.2f})", "passed": cand >= floor,
            "threshold": f"≥ {floor:.2f} (baseline - {config['tolerance']:g})"}


def evaluate_gates(replay_path: str | Path, eval_path: str | Path, baseline_path: str | Path,
                   config_path: str | Path | None = None) -> dict[str, Any]:  # fmt: skip
    """All three gates.

    Returns:
      {"passed": bool, "gates": [{"gate", "measured", "threshold", "passed"}] (latency, business,
       general), "versions": the replay's {"policy", "harness"}, "inputs": the three paths}.
    Raises:
      GateInputError: a missing or unreadable file, a missing field (named), a bad config.
    """
    config = load_config(config_path)
    replay = read_json(replay_path, "--replay")
    candidate, baseline = read_json(eval_path, "--eval"), read_json(baseline_path, "--baseline")
    versions = replay.get("versions")
    if not isinstance(versions, Mapping) or not {"policy", "harness"} <= set(versions):
        raise GateInputError(f"--replay {replay_path}: missing field 'versions' with 'policy' and 'harness'")
    where = (f"--eval {eval_path}", f"--baseline {baseline_path}")
    gates = [
        latency_gate(replay, config["latency"], f"--replay {replay_path}"),
        business_gate(candidate, baseline, config["business"], where),
        general_gate(candidate, baseline, config["general"], where),
    ]
    return {"passed": all(g["passed"] for g in gates), "gates": gates, "versions": dict(versions),
            "inputs": {"replay": str(replay_path), "eval": str(eval_path), "baseline": str(baseline_path)}}


def gates_markdown(result: Mapping[str, Any]) -> str:
    """The gate table with the policy and harness versions above it."""
    v = result["versions"]
    h = v["harness"]
    lines = [
        f"policy version: {v['policy'].get('version')} | harness version: {h.get('name')} {h.get('version')} "
        f"(sha256 {str(h.get('sha256', ''))[:16]})",
        "",
        "| gate | measured | threshold | result |",
        "|---|---|---|---|",
    ]
    lines += [f"| {g['gate']} | {g['measured']} | {g['threshold']} | {'PASS' if g['passed'] else 'FAIL'} |"
              for g in result["gates"]]  # fmt: skip
    lines += ["", f"release: {'all gates pass' if result['passed'] else 'blocked'}"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status (module docstring)."""
    p = argparse.ArgumentParser(prog="python -m hat_jax.deploy.gates", description=__doc__.split("\n")[0])
    p.add_argument("--replay", required=True, help="replay.json of python -m hat_jax.deploy.replay")
    p.add_argument("--eval", required=True, help="results.json of the candidate")
    p.add_argument("--baseline", required=True, help="results.json of the released (or base) policy")
    p.add_argument("--config", default=None, help=f"YAML overriding {DEFAULT_CONFIG.name}")
    p.add_argument("--json", default=None, help="also write the gate results here")
    args = p.parse_args(argv)
    try:
        result = evaluate_gates(args.replay, args.eval, args.baseline, args.config)
    except GateInputError as exc:
        print(f"gates: error: {exc}", file=sys.stderr)
        return 2
    print(gates_markdown(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
