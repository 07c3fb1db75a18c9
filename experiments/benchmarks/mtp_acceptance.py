"""Offline MTP acceptance of a checkpoint: the share of positions where the MTP head's greedy draft equals the main
model's greedy next token, teacher-forced on held-out Live QA oracle trajectories (`hat_jax.eval.mtp_acceptance`:
the accounting, its source, and why depth 1 only). A script that prints figures (not a test).

    .venv/bin/python experiments/benchmarks/mtp_acceptance.py --ckpt RUN_DIR [--items 50] [--max-len 4096]
        [--sft-tasks 2000] [--rl-tasks 1000] [--batch 4] [--bucket 256] [--compute-dtype float32] [--json OUT]

--ckpt: a stage run directory or model checkpoint with its `tokenizer/` folder (as every stage writes it; the
latest step's params). The episodes: the oracle's trajectories of the first --items `live_qa` eval items of the
default world (no viewer message of its --sft-tasks / --rl-tasks training tasks, the presets' default), rendered with the chat template under the production
harness, cut to --max-len tokens. Printed: a table of depth, per-position acceptance and mean accepted length
(tokens per verifying forward with that many speculative tokens), plus how often the main model's and the
draft's greedy tokens equal the trajectory's; --json writes the same figures.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench_util import loadavg


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ckpt", required=True, help="stage run dir or model checkpoint (with a tokenizer/ folder)")
    ap.add_argument("--items", type=int, default=50, help="live_qa eval items whose oracle trajectories are scored")
    ap.add_argument("--sft-tasks", type=int, default=2000, help="the world's SFT tasks (excluded from the items)")
    ap.add_argument("--rl-tasks", type=int, default=1000, help="the world's RL tasks (excluded from the items)")
    ap.add_argument("--max-len", type=int, default=4096, help="episodes cut to this many tokens")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--bucket", type=int, default=256, help="padded lengths are multiples of this")
    ap.add_argument("--compute-dtype", default="float32")
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args(argv)

    from hat_jax.data.world_data import WorldDataConfig
    from hat_jax.eval.mtp_acceptance import acceptance_report, live_qa_oracle_episodes
    from hat_jax.model.checkpoint_io import load_model_checkpoint
    from hat_jax.model.params import COMPUTE_DTYPES
    from hat_jax.model.transformer import Qwen3_5MoeForCausalLM
    from hat_jax.rollout.checkpoint import tokenizer_from_checkpoint
    from hat_jax.tokenizer import load_tokenizer

    t0 = time.perf_counter()
    folder = tokenizer_from_checkpoint(args.ckpt)
    if folder is None:
        raise SystemExit(f"error: {args.ckpt!r} has no tokenizer/ folder (in it or its parent)")
    config, params = load_model_checkpoint(args.ckpt)
    tokenizer = load_tokenizer(folder)
    episodes = live_qa_oracle_episodes(tokenizer, WorldDataConfig(sft_tasks=args.sft_tasks, rl_tasks=args.rl_tasks,
                                                                      eval_items=args.items), args.max_len)
    model = Qwen3_5MoeForCausalLM(config, dtype=COMPUTE_DTYPES[args.compute_dtype])
    report = acceptance_report(model, params, episodes, batch_size=args.batch, bucket=args.bucket,
                               pad_id=config.pad_token_id)
    report.update(checkpoint=str(Path(args.ckpt).resolve()), items=args.items, max_len=args.max_len,
                  seconds=round(time.perf_counter() - t0, 1), load=loadavg())
    print(f"MTP acceptance, {report['episodes']} held-out live_qa oracle episodes, {report['positions']} positions "
          f"({args.ckpt})")
    print(f"{'depth':>5}  {'acceptance':>10}  {'mean accepted length':>20}")
    for row in report["depths"]:
        print(f"{row['depth']:>5}  {row['per_position_acceptance']:>10.4f}  {report['mean_accepted_length']:>20.4f}")
    print(f"main greedy == data: {report['main_greedy_matches_data']:.4f}   MTP draft == data: "
          f"{report['mtp_draft_matches_data']:.4f}   ({report['seconds']} s, load {report['load']})")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
