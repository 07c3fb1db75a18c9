"""The MTP loss's cost in the SFT train step: the stage's own jitted step (`hat_jax.train.sft.sft_loss_fn` +
`make_train_step`) with mtp_coef 0 and > 0, timed interleaved on one packed batch (so a shared machine's load
drifts over both alike). A script that prints figures (not a test).

    .venv/bin/python experiments/benchmarks/mtp_step_bench.py [--preset tiny] [--rows 4] [--seq-len 2048]
        [--docs 2] [--loss-tokens 60] [--pairs 5] [--mtp-coef 0.1] [--vocab-chunk N] [--block-rows 256,none]
        [--json OUT]

Batch: `--rows` packed rows of `--seq-len` tokens, each `--docs` documents whose last `--loss-tokens` tokens are
loss tokens (tiny's SFT: 4 x 2,048 tokens, ~470 loss tokens per step). Printed: the median step seconds and
tokens/s of each arm over `--pairs` interleaved rounds (compilation excluded), the slowdown of the medians and the
median of the pairs' ratios. `--block-rows` lists the `sft_loss_fn(block_rows=)` values to run (each with MTP off
and on): 256 computes the logits only on the 256-position blocks that hold a loss token, none the full [B, T, V]
logits of every position.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from bench_util import interleaved_step_times, loadavg


def packed_batch(rows: int, seq_len: int, docs: int, loss_tokens: int, vocab: int) -> dict[str, np.ndarray]:
    """[1, rows, seq_len] input_ids / segment_ids / loss_mask: `docs` equal documents per row, loss on the last
    `loss_tokens` of each."""
    ids = np.random.RandomState(0).randint(1, vocab, (rows, seq_len)).astype(np.int32)
    seg = np.repeat(np.arange(1, docs + 1, dtype=np.int32), seq_len // docs)
    seg = np.broadcast_to(np.pad(seg, (0, seq_len - seg.size)), (rows, seq_len)).copy()
    loss = np.zeros((rows, seq_len), np.int32)
    for d in range(1, docs + 1):
        end = np.flatnonzero(seg[0] == d)[-1] + 1
        loss[:, end - loss_tokens:end] = 1
    return {"input_ids": ids[None], "segment_ids": seg[None], "loss_mask": loss[None]}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--docs", type=int, default=2)
    ap.add_argument("--loss-tokens", type=int, default=60)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--mtp-coef", type=float, default=0.1)
    ap.add_argument("--vocab-chunk", type=int, default=None)
    ap.add_argument("--block-rows", default="256", help="comma list of block_rows values; 'none' = full logits")
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    import jax

    from hat_jax.model import Qwen3_5MoeForCausalLM, get_config, init_params
    from hat_jax.train.optim import OptimConfig, make_optimizer
    from hat_jax.train.sft import sft_loss_fn
    from hat_jax.train.trainer import init_train_state, make_train_step, place_state

    config = get_config(args.preset)
    model = Qwen3_5MoeForCausalLM(config, router_stats=True)
    optimizer = make_optimizer(OptimConfig().resolve(100))
    batch = {k: jax.numpy.asarray(v) for k, v in packed_batch(args.rows, args.seq_len, args.docs, args.loss_tokens,
                                                                 config.vocab_size).items()}
    block_rows = [None if v.strip().lower() == "none" else int(v) for v in args.block_rows.split(",")]
    arms = {}
    for rows in block_rows:
        for mtp, coef in (("off", 0.0), ("on", args.mtp_coef)):
            step = make_train_step(sft_loss_fn(model, args.vocab_chunk, mtp=coef > 0, block_rows=rows),
                                   optimizer, lb_coef=0.001, mtp_coef=coef)
            arms[f"mtp {mtp}, block_rows {rows}"] = [step, place_state(init_train_state(
                init_params(config, jax.random.key(0)), optimizer, jax.random.key(1))), batch]
    times, median = interleaved_step_times(arms, args.pairs)
    tokens = args.rows * args.seq_len
    report = {"preset": args.preset, "rows": args.rows, "seq_len": args.seq_len, "loss_tokens_per_step":
              int(batch["loss_mask"].sum()), "pairs": args.pairs, "load": loadavg(),
              "step_s": times, "median_step_s": median,
              "median_tokens_per_s": {k: tokens / v for k, v in median.items()}, "slowdown": {},
              "median_pair_slowdown": {}}
    for k in arms:
        print(f"{k:>26}: median {median[k]:.3f} s/step, {report['median_tokens_per_s'][k]:.0f} tok/s  "
              f"({', '.join(f'{t:.2f}' for t in times[k])})")
    for rows in block_rows:
        on, off = f"mtp on, block_rows {rows}", f"mtp off, block_rows {rows}"
        report["slowdown"][str(rows)] = median[on] / median[off] - 1.0
        report["median_pair_slowdown"][str(rows)] = float(np.median(np.divide(times[on], times[off]))) - 1.0
        print(f"block_rows {rows}: slowdown with MTP {100 * report['slowdown'][str(rows)]:+.1f}% of the medians, "
              f"{100 * report['median_pair_slowdown'][str(rows)]:+.1f}% median over the pairs")
    print(f"load {report['load']}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
