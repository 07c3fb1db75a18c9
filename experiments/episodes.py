"""Reads an experiment's evaluation episodes: how each suite's episodes ended, and a few of each kind.

    python experiments/run.py --exp table6_both
    python experiments/episodes.py runs/table6_both                    # Live QA and Variant QA, every seed
    python experiments/episodes.py runs/table6_both --suite tool_robustness --show 5

Kinds (`hat_jax.experiments.episodes`): answered, abstained after a tool returned the answer, abstained, no fact
asked, inaccurate, cut; with the calls by status (unknown_tool: a name the harness does not have) and the
refusals of answerable questions; for a suite of several perturbations (Tool robustness) its name validity,
gold chain and calls per episode by perturbation. An Accuracy earned by abstaining shows here, not in the
average. The argument may also be any folder holding `<suite>.jsonl` files (`DIR/evals/...`). Exit status: 0
printed, 2 nothing to read or a file that cannot be read (nothing printed then).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a clone without installing
    sys.path.insert(0, str(ROOT))

from hat_jax.data.suites import SUITES  # noqa: E402
from hat_jax.experiments.episodes import (  # noqa: E402
    breakdown_markdown, perturbation_markdown, read_records, records_episodes, suite_files)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python experiments/episodes.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("path", help="runs/<experiment> (experiments/run.py's row folder) or a folder of "
                                     "<suite>.jsonl files")
    parser.add_argument("--suite", action="append", choices=SUITES,
                        help="a live-stream suite (repeatable; default live_qa and variant_qa)")
    parser.add_argument("--show", type=int, default=2, help="episodes shown per kind (default 2; 0: counts only)")
    parser.add_argument("--width", type=int, default=100, help="characters of a reply or call list shown")
    args = parser.parse_args(argv)
    if args.show < 0 or args.width < 10:
        parser.error(f"--show {args.show} / --width {args.width}: expected --show >= 0 and --width >= 10")
    try:
        files = suite_files(args.path, args.suite or ("live_qa", "variant_qa"))
        suites = []
        for f in files:  # every file read and checked before any output
            records = read_records(f)
            suites.append((f, records, *records_episodes(records, f)))
        for f, records, episodes, turns in suites:
            print(breakdown_markdown(str(f), episodes, show=args.show, width=args.width, turn_texts=turns))
            by_perturbation = perturbation_markdown(records)
            if by_perturbation:
                print("Reading by perturbation (schema_variant: tools renamed with HSA's training families):\n")
                print(by_perturbation)
    except (OSError, ValueError) as e:  # UnicodeDecodeError is a ValueError
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
