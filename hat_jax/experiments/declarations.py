"""Ablation declarations: the rows of the HAT report's tables as named chains of training stages.

A declaration file (`ablations/<group>.yaml`) holds one table (the HAT report, arXiv 2608.15763, Tables 3-6):

    group: table6
    title: "Table 6: ..."
    columns: [ifeval.prompt_strict, live_qa.avg]       # results.json metric paths shown in the table
    rows:
      - name: table6_both
        description: "SFT and RL both with HSA"
        chain: ["sft:hsa", "rl:hsa"]                   # stages from the base, in order
        paper: {ifeval.prompt_strict: 81.3}             # the paper's numbers, same metric paths
      - name: table6_both_gdpo
        description: "the same with GDPO"
        chain: ["sft:hsa", {stage: "rl:hsa", set: {estimator: gdpo}}]   # a stage with config overrides
    differences:                                       # optional: row minus row, paired, with 95% intervals
      - {name: "...", minuend: ROW, subtrahend: ROW, paper: {metric: value}}

A stage is `kind:variant` (`hat_jax.experiments.stage_kinds.STAGE_KINDS`): `sft:original|hsa`,
`rl:original|hsa` (the harness the stage trains on), `opd:general` (general on-policy distillation, teacher =
the base) and `opd_live:original|hsa` (on-policy distillation from the scale's strong teacher along
live-stream episodes), or a mapping {stage: "kind:variant", set: {field.path: value, ...}} whose `set`
overrides fields of the scale's config for that stage only (checked against the stage's config class at load;
fields the chain sets are refused). An empty chain is the base itself. Files are read with `yaml.safe_load`
only; an unknown key is an error, and every error names the file, the row and the field.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from hat_jax.experiments.stage_kinds import STAGE_KINDS, check_overrides
from hat_jax.judges.reading import READING_KEYS
from hat_jax.judges.rules import SUITE_KEYS as LIVE_SUITE_KEYS

IF_KEYS: tuple[str, ...] = ("prompt_strict", "inst_strict", "prompt_loose", "inst_loose")  # `eval.if_checker`
# results.json "metrics" layout: each live-stream suite's keys (from the judge metric table, then the reading
# metrics of `hat_jax.judges.reading`), then IFEval's.
SUITE_KEYS: dict[str, tuple[str, ...]] = {**{s: (*keys, *READING_KEYS) for s, keys in LIVE_SUITE_KEYS.items()},
                                          "ifeval": IF_KEYS, "ifeval_mini": IF_KEYS}
METRIC_PATHS: tuple[str, ...] = tuple(f"{s}.{k}" for s, keys in SUITE_KEYS.items() for k in keys)
METRIC_LABELS: dict[str, str] = {
    "live_qa": "Live QA", "variant_qa": "Variant QA", "tool_robustness": "Tool rob.",
    "prompt_robustness": "Prompt rob.", "ifeval": "IFEval", "ifeval_mini": "IF-mini",
}
# Column labels of the keys whose name does not read as one (others: the key with spaces).
KEY_LABELS: dict[str, str] = {"name_valid": "name validity", "skill_acc": "skill selection",
                              "chain_done": "gold chain done", "fact_fetched": "fact fetched",
                              "calls_per_ep": "calls / episode"}


class DeclarationError(ValueError):
    """A malformed declaration file: names the file, the field and what was expected."""


@dataclasses.dataclass(frozen=True)
class StageSpec:
    """One stage of a chain: kind in `STAGE_KINDS`, variant one of its variants, and overrides of its config:
    ((field path, value), ...) in declaration order (values as YAML gives them)."""

    kind: str
    variant: str
    overrides: tuple[tuple[str, Any], ...] = ()

    @property
    def name(self) -> str:
        """"kind:variant" (what a stage's key hashes beside its resolved config)."""
        return f"{self.kind}:{self.variant}"

    @property
    def label(self) -> str:
        """The stage in run-dir names ("sft-hsa"); overrides show in the key."""
        return f"{self.kind}-{self.variant}"

    @property
    def harness(self) -> str:
        """What results.json's `stages[].harness` records: "hsa" or "original" (general OPD: original)."""
        return "hsa" if self.variant == "hsa" else "original"

    def __str__(self) -> str:
        if not self.overrides:
            return self.name
        return self.name + "[" + ", ".join(f"{k}={json.dumps(v)}" for k, v in self.overrides) + "]"


@dataclasses.dataclass(frozen=True)
class Experiment:
    """One table row: a named chain of stages and the paper's numbers for it."""

    name: str
    group: str
    description: str
    chain: tuple[StageSpec, ...]
    paper: Mapping[str, float]


@dataclasses.dataclass(frozen=True)
class Group:
    """One table: its rows in order, the metric columns it shows, optional row differences (Table 5)."""

    name: str
    title: str
    columns: tuple[str, ...]
    rows: tuple[Experiment, ...]
    differences: tuple[Mapping[str, Any], ...] = ()
    source: str = ""


def parse_stage(text: Any, where: str) -> StageSpec:
    """`"kind:variant"` or {stage: "kind:variant", set: {field.path: value}} -> StageSpec.

    Raises:
      DeclarationError: naming `where`: not a stage (lists the valid ones), an unknown key of the mapping, an
        override of a field the config does not have, of a mistyped value or of a field the chain sets.
    """
    valid = ", ".join(f"{k}:{v}" for k, kind in STAGE_KINDS.items() for v in kind.variants)
    if isinstance(text, Mapping):
        _known_keys(text, ("stage", "set"), where)
        spec = parse_stage(_required(text, "stage", str, where), f"{where}.stage")
        return dataclasses.replace(spec, overrides=_overrides(spec, text.get("set") or {}, f"{where}.set"))
    if not isinstance(text, str) or text.count(":") != 1:
        raise DeclarationError(f"{where}: expected a stage 'kind:variant' ({valid}) or a mapping with stage and "
                               f"set, got {text!r}")
    kind, variant = (p.strip() for p in text.split(":"))
    if variant not in (STAGE_KINDS[kind].variants if kind in STAGE_KINDS else ()):
        raise DeclarationError(f"{where}: unknown stage {text!r}; valid: {valid}")
    return StageSpec(kind, variant)


def _overrides(spec: StageSpec, data: Any, where: str) -> tuple[tuple[str, Any], ...]:
    if not isinstance(data, Mapping) or not all(isinstance(k, str) for k in data):
        raise DeclarationError(f"{where}: expected a mapping of field path -> value, got {data!r}")
    overrides = tuple(data.items())
    try:
        check_overrides(STAGE_KINDS[spec.kind], spec.variant, overrides)
    except ValueError as err:
        raise DeclarationError(f"{where}.{err}") from None
    return overrides


def _known_keys(data: Mapping, valid: tuple[str, ...], where: str) -> None:
    """Raises DeclarationError naming `where` and the first key of `data` not in `valid` (with a close match)."""
    for key in data:
        if key not in valid:
            close = difflib.get_close_matches(str(key), valid, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise DeclarationError(f"{where}: unknown key {key!r}{hint}; valid: {', '.join(valid)}")


def _paper(data: Any, where: str) -> dict[str, float]:
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise DeclarationError(f"{where}: expected a mapping of metric path -> number, got {type(data).__name__}")
    out = {}
    for key, value in data.items():
        if key not in METRIC_PATHS:
            close = difflib.get_close_matches(str(key), METRIC_PATHS, n=3)
            raise DeclarationError(f"{where}.{key}: unknown metric path" + (f"; did you mean {close}?" if close else
                                   f"; valid: {', '.join(METRIC_PATHS)}"))
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise DeclarationError(f"{where}.{key}: expected a number, got {value!r}")
        out[key] = float(value)
    return out


def _required(data: Mapping, key: str, kind: type, where: str):
    if key not in data:
        raise DeclarationError(f"{where}: missing field {key!r}")
    value = data[key]
    if not isinstance(value, kind):
        raise DeclarationError(f"{where}.{key}: expected {kind.__name__}, got {type(value).__name__}")
    return value


GROUP_KEYS = ("group", "title", "columns", "rows", "differences")
ROW_KEYS = ("name", "description", "chain", "paper")
DIFFERENCE_KEYS = ("name", "minuend", "subtrahend", "paper")


def load_group(path: str | Path) -> Group:
    """Reads and validates one declaration file.

    Raises:
      DeclarationError: unreadable YAML, an unknown key, a missing or mistyped field, an unknown stage or metric
        path, a bad stage override (see `parse_stage`), a row name that does not start with the group name,
        duplicate row names, a difference naming no row. Row errors name the row: `FILE.rows[i] (name).field`.
    """
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise DeclarationError(f"{path}: cannot read the declaration: {err}") from err
    if not isinstance(data, Mapping):
        raise DeclarationError(f"{path}: expected a mapping with group, title, columns, rows")
    where = str(path)
    _known_keys(data, GROUP_KEYS, where)
    name = _required(data, "group", str, where)
    title = _required(data, "title", str, where)
    columns = tuple(_required(data, "columns", list, where))
    _paper({c: 0 for c in columns}, f"{where}.columns")
    rows: list[Experiment] = []
    for i, row in enumerate(_required(data, "rows", list, where)):
        rows.append(_load_row(row, f"{where}.rows[{i}]", name, {r.name for r in rows}))
    seen = {r.name for r in rows}
    differences = [_load_difference(diff, f"{where}.differences[{i}]", name, seen)
                   for i, diff in enumerate(data.get("differences") or ())]
    return Group(name, title, columns, tuple(rows), tuple(differences), where)


def _load_row(row: Any, rw: str, group: str, seen: set[str]) -> Experiment:
    if not isinstance(row, Mapping):
        raise DeclarationError(f"{rw}: expected a mapping with name, description, chain")
    row_name = _required(row, "name", str, rw)
    rw = f"{rw} ({row_name})"
    _known_keys(row, ROW_KEYS, rw)
    if not row_name.startswith(group + "_"):
        raise DeclarationError(f"{rw}.name: {row_name!r} must start with the group name '{group}_'")
    if row_name in seen:
        raise DeclarationError(f"{rw}.name: duplicate row {row_name!r}")
    chain = tuple(parse_stage(s, f"{rw}.chain[{j}]") for j, s in enumerate(_required(row, "chain", list, rw)))
    return Experiment(row_name, group, _required(row, "description", str, rw), chain,
                      _paper(row.get("paper"), f"{rw}.paper"))


def _load_difference(diff: Any, dw: str, group: str, rows: set[str]) -> dict:
    if not isinstance(diff, Mapping):
        raise DeclarationError(f"{dw}: expected a mapping with name, minuend, subtrahend, paper")
    _known_keys(diff, DIFFERENCE_KEYS, dw)
    for key in ("minuend", "subtrahend"):
        if _required(diff, key, str, dw) not in rows:
            raise DeclarationError(f"{dw}.{key}: {diff[key]!r} is not a row of {group}")
    return {"name": _required(diff, "name", str, dw), "minuend": diff["minuend"], "subtrahend": diff["subtrahend"],
            "paper": _paper(diff.get("paper"), f"{dw}.paper")}


def default_ablations_dir() -> Path:
    """`ablations/` at the repository root (next to the `hat_jax` package)."""
    return Path(__file__).resolve().parents[2] / "ablations"


def load_all(directory: str | Path | None = None) -> dict[str, Group]:
    """Every `*.yaml` of `directory` (default: the repository's `ablations/`), by group name.

    Raises:
      FileNotFoundError: the directory does not exist or holds no declaration.
      DeclarationError: a bad file (see `load_group`), two files declaring one group or one row name.
    """
    directory = Path(directory) if directory is not None else default_ablations_dir()
    files = sorted(directory.glob("*.yaml")) if directory.is_dir() else []
    if not files:
        raise FileNotFoundError(f"no ablation declarations (*.yaml) in {str(directory)!r}")
    groups: dict[str, Group] = {}
    rows: dict[str, str] = {}
    for path in files:
        group = load_group(path)
        if group.name in groups:
            raise DeclarationError(f"{path}: group {group.name!r} is also declared in {groups[group.name].source}")
        for row in group.rows:
            if row.name in rows:
                raise DeclarationError(f"{path}: row {row.name!r} is also declared in {rows[row.name]}")
            rows[row.name] = str(path)
        groups[group.name] = group
    return groups


def resolve(name: str, groups: Mapping[str, Group]) -> tuple[Group, tuple[Experiment, ...]]:
    """A group name -> (group, all its rows); a row name -> (its group, (row,)).

    Raises:
      KeyError: unknown name; the message lists the close matches (or every name).
    """
    if name in groups:
        return groups[name], groups[name].rows
    for group in groups.values():
        for row in group.rows:
            if row.name == name:
                return group, (row,)
    names = list(groups) + [r.name for g in groups.values() for r in g.rows]
    close = difflib.get_close_matches(name, names, n=5, cutoff=0.5)
    hint = f"did you mean: {', '.join(close)}?" if close else f"valid: {', '.join(names)}"
    raise KeyError(f"unknown experiment {name!r}; {hint} (python experiments/run.py --list shows all)")
