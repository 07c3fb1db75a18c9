"""Judges the HAT report's claims C1-C5 on every finished row of a run directory and writes DIR/claims.md.

    python experiments/run.py --exp table3 --seeds 0,1,2 --out runs3
    python experiments/run.py --exp table4 --seeds 0,1,2 --out runs3 --resume
    python experiments/claims.py runs3            # C1-C5: replicated / not replicated / not separable / not run

Each claim's conditions are differences of cells (row, metric) with 95% intervals, paired by seed and item
(`hat_jax.experiments.claims`, `hat_jax.experiments.intervals`; docs/results.md). A claim whose rows have not run
says so; an interval that cannot be computed (too few items, rows scored on different eval sets or seeds) is
refused with the reason in its place. Exit status: 0 written, 2 no results.json under DIR.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a clone without installing
    sys.path.insert(0, str(ROOT))

from hat_jax.experiments.claims import claims_markdown, load_run_results  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python experiments/claims.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="the run directory (experiments/run.py --out)")
    args = parser.parse_args(argv)
    results = load_run_results(args.out)
    if not results:
        print(f"error: no DIR/<row>/results.json under {args.out!r}; run experiments/run.py --out {args.out} first",
              file=sys.stderr)
        return 2
    text = claims_markdown(results)
    (Path(args.out) / "claims.md").write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
