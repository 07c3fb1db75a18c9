"""Offline MTP acceptance of a checkpoint: the share of positions where the MTP chain's greedy drafts equal the main
model's greedy next tokens, for draft depths 1..k, teacher-forced on held-out Live QA oracle trajectories
(`hat_jax.eval.mtp_acceptance`: the accounting and its source). A script that prints figures (not a test).

    .venv/bin/python experiments/benchmarks/mtp_acceptance.py --ckpt RUN_DIR [--depth 3] [--items 50]
        [--max-len 4096] [--sft-tasks 2000] [--rl-tasks 1000] [--batch 4] [--bucket 256] [--chain-rows 64]
        [--compute-dtype float32] [--json OUT]

--ckpt: a stage run directory or model checkpoint with its `tokenizer/` folder (as every stage writes it; the
latest step's params). The episodes: the oracle's trajectories of the first --items `live_qa` eval items of the
default world (no viewer message of its --sft-tasks / --rl-tasks training tasks: tiny's and the larger presets'
defaults; pass the micro preset's 48 / 16 for a micro run), rendered with the chat template under the production
harness, cut to --max-len tokens. Printed, for each depth j <= --depth: the conditional acceptance (accepted at j
among those accepted at j-1), the per-position acceptance (the share of positions whose first j drafts are all
accepted: vLLM's per-position acceptance rate) and the mean accepted length with j speculative tokens (tokens
per verifying forward); then how often the main model's and the depth-1 draft's greedy tokens equal the
trajectory's. --json writes the same figures. Read it beside vLLM's spec-decode metrics on a GPU
(`export/check_vllm.py`) and the online figures of `spec_decode_bench.py --prompts live_qa`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench_util import loadavg

from hat_jax.cli_types import int_in, positive_int


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()),
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                                 epilog="Columns: conditional = accepted at depth j / accepted at j-1; per-position = "
                                        "share of positions whose first j drafts are all accepted (vLLM's); mean "
                                        "accepted length = 1 + the per-position sum. '== data': how often the main "
                                        "model's / the depth-1 draft's greedy token equals the trajectory's.")
    ap.add_argument("--ckpt", required=True, help="stage run dir or model checkpoint (with a tokenizer/ folder)")
    ap.add_argument("--depth", type=positive_int, default=3, help="speculative tokens: drafts of depth 1..DEPTH")
    ap.add_argument("--items", type=positive_int, default=50,
                    help="live_qa eval items whose oracle trajectories are scored")
    ap.add_argument("--sft-tasks", type=int, default=2000, help="the world's SFT tasks (excluded from the items)")
    ap.add_argument("--rl-tasks", type=int, default=1000, help="the world's RL tasks (excluded from the items)")
    ap.add_argument("--max-len", type=int_in(3), default=4096, help="episodes cut to this many tokens")
    ap.add_argument("--batch", type=positive_int, default=4, help="episodes per forward")
    ap.add_argument("--chain-rows", type=positive_int, default=64,
                    help="positions drafted at once at depth > 1 (each holds a copy of the MTP layer's KV cache)")
    ap.add_argument("--bucket", type=positive_int, default=256, help="padded lengths are multiples of this")
    ap.add_argument("--compute-dtype", default="float32", choices=("float32", "bfloat16"),
                    help="the forward's compute dtype")
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
    if not Path(args.ckpt).exists():
        raise SystemExit(f"error: --ckpt {args.ckpt!r} does not exist")
    folder = tokenizer_from_checkpoint(args.ckpt)
    if folder is None:
        raise SystemExit(f"error: {args.ckpt!r} has no tokenizer/ folder (in it or its parent)")
    config, params = load_model_checkpoint(args.ckpt)
    tokenizer = load_tokenizer(folder)
    episodes = live_qa_oracle_episodes(tokenizer, WorldDataConfig(sft_tasks=args.sft_tasks, rl_tasks=args.rl_tasks,
                                                                      eval_items=args.items), args.max_len)
    model = Qwen3_5MoeForCausalLM(config, dtype=COMPUTE_DTYPES[args.compute_dtype])
    if not episodes:
        raise SystemExit(f"error: no episode has a generated token within --max-len {args.max_len} tokens "
                         f"(--items {args.items}): raise --max-len")
    report = acceptance_report(model, params, episodes, batch_size=args.batch, bucket=args.bucket,
                               pad_id=config.pad_token_id, depth=args.depth, chain_rows=args.chain_rows)
    report.update(checkpoint=str(Path(args.ckpt).resolve()), items=args.items, max_len=args.max_len,
                  seconds=round(time.perf_counter() - t0, 1), load=loadavg())
    print(f"MTP acceptance, {report['episodes']} held-out live_qa oracle episodes, {report['positions']} positions "
          f"({args.ckpt})")
    print(f"{'depth':>5}  {'conditional':>11}  {'per-position acceptance':>23}  {'mean accepted length':>20}")
    length = 1.0
    for row in report["depths"]:
        length += row["per_position_acceptance"]
        print(f"{row['depth']:>5}  {row['acceptance']:>11.4f}  {row['per_position_acceptance']:>23.4f}  {length:>20.4f}")
    print(f"main greedy == data: {report['main_greedy_matches_data']:.4f}   MTP depth-1 draft == data: "
          f"{report['mtp_draft_matches_data']:.4f}   ({report['seconds']} s, load {report['load']})")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
