"""How a base's reading grows over its checkpoints: the recall probe, the reading gauge (zero-shot) and the
reading exercises per kind, scored on each saved step of a pretraining run. A script that prints figures.

    .venv/bin/python experiments/benchmarks/base_reading.py RUN [--steps 100,200] [--items 64]
        [--kinds label,lookup,copy] [--json OUT]

RUN is a pretraining run folder (`<cache>/bases/base-<hash>[.partial]`, with model_config.json, tokenizer/ and
the step folders its `max_to_keep` kept); every step is scored unless --steps picks some. Figures as in the
base's base_report.json (`hat_jax.train.recall_probe`): recall probe exact / first token on --items prompts,
gauge exact per family on --items rows, exercises exact answers / first answer token / answer tokens on
--items / 4 fresh chats per kind; for kinds whose answers are listed names, a second line splits them by where
the name stands beside its description (desc_first: `- description: name`; name_first: a harness's order), and
for kinds whose answers copy different things, a third line splits them by what they copy (name, query, id,
key, reply).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=Path, help="pretraining run folder")
    p.add_argument("--steps", help="comma list of steps (default: every step folder)")
    p.add_argument("--items", type=int, default=64, help="probe prompts and gauge rows; exercises: items / 4 chats")
    p.add_argument("--kinds", default=None, help="reading kinds (default: the run's reading_kinds)")
    p.add_argument("--json", help="write the figures to this file")
    args = p.parse_args(argv)
    if not args.run.is_dir():
        p.error(f"RUN {args.run}: not a folder (expected a pretraining run folder with step folders)")
    if args.items < 1:
        p.error(f"--items {args.items}: expected a count >= 1")
    stage = json.loads((args.run / "stage_config.json").read_text()) if (args.run / "stage_config.json").is_file() \
        else {}
    steps = sorted(int(d.name) for d in args.run.iterdir() if d.is_dir() and d.name.isdigit())
    if args.steps:
        try:
            wanted = [int(s) for s in args.steps.split(",")]
        except ValueError:
            p.error(f"--steps {args.steps!r}: expected a comma list of step numbers, e.g. 200,400")
        missing = [s for s in wanted if s not in steps]
        if missing:
            p.error(f"--steps {missing} not saved in {args.run} (saved: {steps})")
        steps = wanted
    if not steps:
        p.error(f"{args.run} holds no step folders")
    kinds = args.kinds.split(",") if args.kinds else list(stage.get("reading_kinds") or ["label"])

    from hat_jax.data.reading import check_kinds, token_symbols
    from hat_jax.model.checkpoint_io import load_model_checkpoint
    from hat_jax.tokenizer import load_tokenizer
    from hat_jax.train.recall_probe import reading_exercise_figures, reading_gauge_figures, recall_probe_figures

    try:
        check_kinds("--kinds", kinds)
    except ValueError as err:
        p.error(str(err))
    tokenizer = load_tokenizer(args.run / "tokenizer")
    symbols = token_symbols(tokenizer) if stage.get("reading_vocab") else ()  # the exercises the base trained on
    print("probe: exact/first token; gauge: exact per family; exercises per kind: exact answers/first answer "
          "token/answer tokens", flush=True)
    out = []
    for step in steps:
        config, params = load_model_checkpoint(args.run / str(step))
        probe = recall_probe_figures(params, config, tokenizer, args.items)
        gauge = reading_gauge_figures(params, config, tokenizer, args.items)
        reading = reading_exercise_figures(params, config, tokenizer, -(-args.items // 4), kinds, symbols=symbols)
        out.append({"step": step, "probe": probe, "reading_gauge": gauge, "reading": reading})
        ex = "; ".join(f"{k} {v['exact']:.2f}/{v['first_token']:.2f}/{v['token_acc']:.2f}"
                       for k, v in reading["kinds"].items())
        print(f"step {step:5d}  probe {probe['exact']:.3f}/{probe['first_token']:.3f}  gauge "
              + " ".join(f"{f} {v:.3f}" for f, v in gauge["exact"].items()) + f"  exercises {ex}", flush=True)
        for key, what in (("by_order", "listed names by order"), ("by_role", "answers by what they copy")):
            split = "; ".join(f"{k} " + " ".join(f"{o} {v['exact']:.2f}/{v['first_token']:.2f} ({v['answers']})"
                                                 for o, v in kv[key].items())
                              for k, kv in reading["kinds"].items() if key in kv)
            if split:
                print(f"            {what} (exact/first token (answers)): {split}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"run": str(args.run), "items": args.items, "curve": out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
