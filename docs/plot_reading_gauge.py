"""Draws docs/reading_gauge_orders.png: the reading gauge's exact names per step for the runs whose curves are in
docs/reading_gauge/ (each the --json of experiments/benchmarks/reading_gauge.py; commands in docs/tuning.md)."""

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


def main() -> None:
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for stem, label in RUNS.items():
        path = DOCS / "reading_gauge" / f"{stem}.json"
        if not path.is_file():
            continue
        curve = json.loads(path.read_text())["curve"]
        steps = [c["step"] for c in curve]
        (line,) = ax.plot(steps, [c["exact"]["renamed"] for c in curve], marker="o", ms=3, label=f"{label}: renamed")
        if stem == "anystyle":
            ax.plot(steps, [c["exact"]["heldout"] for c in curve], ls="--", marker="x", ms=3, color=line.get_color(),
                    label=f"{label}: held-out")
    ax.set(xlabel="step (32 rows each)", ylabel="called names exact (128 rows)", ylim=(-0.02, 1.02),
           title="Reading gauge: which order and which names a tiny model learns to copy")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(DOCS / "reading_gauge_orders.png")


if __name__ == "__main__":
    main()
