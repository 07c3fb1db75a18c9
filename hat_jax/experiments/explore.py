"""Loading an output root's results and curves for notebooks (`notebooks/ablations.ipynb`) and reports.

`group_results(out_root, group)` reads every finished row's results.json; `stage_curves(results, tag)` reads
one TensorBoard scalar from the stage run dirs of a row (via `hat_jax.train.metrics.read_event_scalars`, the
event files themselves, so what the notebook plots is what TensorBoard shows); `comparison_frame` is the
group's table as a pandas DataFrame with our value and the paper's side by side.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hat_jax.experiments.declarations import Group, load_all
from hat_jax.experiments.results import metric_value


def group_results(out_root: str | Path, group: str | Group, ablations: str | Path | None = None) -> dict[str, dict]:
    """{row name: results.json} for the rows of `group` that have finished under `out_root` (others omitted).

    Raises:
      KeyError: unknown group name (lists the valid ones).
    """
    if isinstance(group, str):
        groups = load_all(ablations)
        if group not in groups:
            raise KeyError(f"unknown group {group!r}; valid: {', '.join(groups)}")
        group = groups[group]
    out = {}
    for row in group.rows:
        path = Path(out_root) / row.name / "results.json"
        if path.is_file():
            out[row.name] = json.loads(path.read_text())
    return out


def stage_curves(results: Mapping[str, Any], tag: str, seed_index: int = 0) -> dict[str, list[tuple[int, float]]]:
    """{"<i>-<stage>:<harness>": [(step, value), ...]} of scalar `tag` in each stage run dir of one row (stages
    without that tag omitted). `seed_index` picks the seed's run dirs."""
    from hat_jax.train.metrics import read_event_scalars

    curves = {}
    for i, stage in enumerate(results["stages"]):
        directory = stage["dirs"][seed_index]
        scalars = read_event_scalars(directory) if Path(directory).is_dir() else {}
        if tag in scalars:
            curves[f"{i + 1}-{stage['name']}:{stage['harness']}"] = scalars[tag]
    return curves


def comparison_frame(group: Group, results: Mapping[str, Mapping[str, Any]]):
    """A DataFrame, one row per table row, columns "<metric> ours" and "<metric> paper" for the group's columns."""
    import pandas as pd

    rows = []
    for row in group.rows:
        res = results.get(row.name)
        entry = {"row": row.name}
        for column in group.columns:
            entry[f"{column} ours"] = metric_value(res["metrics"], column) if res else None
            entry[f"{column} paper"] = row.paper.get(column)
        rows.append(entry)
    return pd.DataFrame(rows).set_index("row")
