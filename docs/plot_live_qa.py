"""Draws docs/live_qa.png: Live QA AVG of the tiny chain (docs/results.md) beside the paper's (ablations/*.yaml)."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import yaml  # noqa: E402

DOCS = Path(__file__).resolve().parent
ROWS = {"table3_base": ("the base", 13.0), "table6_both": ("HSA-SFT -> HSA-RL", 23.0)}  # docs/results.md


def paper_live_qa() -> dict[str, float]:
    out = {}
    for path in sorted((DOCS.parent / "ablations").glob("*.yaml")):
        for row in yaml.safe_load(path.read_text())["rows"]:
            if row["name"] in ROWS:
                out[row["name"]] = row["paper"]["live_qa.avg"]
    return out


def main() -> None:
    paper = paper_live_qa()
    labels = [ROWS[name][0] for name in ROWS]
    xs = range(len(ROWS))
    fig, ax = plt.subplots(figsize=(5, 3), dpi=100)
    ax.bar([x - 0.2 for x in xs], [ROWS[n][1] for n in ROWS], 0.4, label="hat-jax tiny (5.1M params, CPU)")
    ax.bar([x + 0.2 for x in xs], [paper[n] for n in ROWS], 0.4, label="paper (Qwen3.6-35B-A3B)")
    ax.set_xticks(list(xs), labels)
    ax.set_ylabel("Live QA AVG (0-100)")
    ax.set_ylim(0, 125)
    ax.set_yticks(range(0, 101, 20))
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title("Live QA: tiny chain vs the paper", fontsize=10)
    fig.tight_layout()
    fig.savefig(DOCS / "live_qa.png")


if __name__ == "__main__":
    main()
