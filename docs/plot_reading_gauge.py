"""Draws docs/reading_gauge_orders.png (the reading gauge's exact names per step) and docs/reading_gauge_parts.png
(the same names split into their first token and the rest) for the runs whose curves are in docs/reading_gauge/
(each the --json of experiments/benchmarks/reading_gauge.py; commands in docs/tuning.md)."""

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

DOCS = Path(__file__).resolve().parent
# file stem -> legend label; every run is a fresh tiny model (or the one --model-set change the label names),
# 800 steps of batch 32, lr 1e-3, seed 0
RUNS = {
    "label_first": "'- label: name', train renamed",
    "name_first": "'- name: label' (a harness's order), train renamed",
    "name_first_attn2": "'- name: label', full attention every 2nd layer",
    "name_first_h192": "'- name: label', twice as wide (hidden 192)",
    "name_first_l16": "'- name: label', twice as deep (16 layers)",
    "anystyle": "'- label: name', train anystyle (held-out styles too)",
}
# runs scored with the first / rest split of each name (`hat_jax.data.reading_gauge.name_token_hits`)
PARTS = {
    "label_first_tokens": "'- label: name'",
    "name_first_tokens": "'- name: label'",
    "name_first_scripts": "'- name: label', scripts split",
    "name_first_attn1": "'- name: label', every layer full attention",
}


def curves(runs: dict[str, str]):
    """(stem, label, steps, curve) of each run in `runs` whose JSON is in docs/reading_gauge/, in `runs`' order."""
    for stem, label in runs.items():
        path = DOCS / "reading_gauge" / f"{stem}.json"
        if path.is_file():
            curve = json.loads(path.read_text())["curve"]
            yield stem, label, [c["step"] for c in curve], curve


def pairs(runs: dict[str, str], solid, dashed, ylabel: str, title: str, out: str, floor=None) -> None:
    """One figure: for each run a solid line `solid(stem, label, curve) -> (values, legend)` and, where `dashed`
    gives one (not None), a dashed line of the same colour; `floor` (value, legend) a dotted grey line."""
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for stem, label, steps, curve in curves(runs):
        values, legend = solid(stem, label, curve)
        (line,) = ax.plot(steps, values, marker="o", ms=3, label=legend)
        second = dashed(stem, label, curve)
        if second is not None:
            ax.plot(steps, second[0], ls="--", marker="x", ms=3, color=line.get_color(), label=second[1])
    if floor is not None:
        ax.axhline(floor[0], color="grey", lw=0.8, ls=":", label=floor[1])
    ax.set(xlabel="step (32 rows each)", ylabel=ylabel, ylim=(-0.02, 1.02), title=title)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(DOCS / out)


def main() -> None:
    share = lambda curve, part, family: [c[part][family] for c in curve]
    pairs(RUNS, lambda stem, label, curve: (share(curve, "exact", "renamed"), f"{label}: renamed"),
          lambda stem, label, curve: ((share(curve, "exact", "heldout"), f"{label}: held-out")
                                      if stem == "anystyle" else None),
          "called names exact (128 rows)", "Reading gauge: which order and which names a tiny model learns to copy",
          "reading_gauge_orders.png")
    pairs(PARTS, lambda stem, label, curve: (share(curve, "first", "renamed"), f"{label}: first token"),
          lambda stem, label, curve: (share(curve, "rest", "renamed"), f"{label}: the rest"),
          "renamed names, part right (128 rows)",
          "Reading gauge: finding the entry (first token) vs copying its name (the rest)", "reading_gauge_parts.png",
          floor=(0.298, "renamed: first token of a listed tool called at random (first_token_chance)"))


if __name__ == "__main__":
    main()
