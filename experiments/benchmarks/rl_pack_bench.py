"""Packing in the RL update: the stage's own jitted step (`hat_jax.train.rl_loss.rl_loss_fn` +
`make_rl_train_step`) on one batch of sampled sequences, unpacked and packed (`hat_jax.train.policy_packing`),
timed interleaved (so a shared machine's load drifts over both alike). A script that prints figures (not a test).

    .venv/bin/python experiments/benchmarks/rl_pack_bench.py [--preset tiny] [--sequences 16] [--width 3072]
        [--lengths 1000:2600 | --lengths 1480,1530,...] [--accum 4] [--pairs 5] [--seed 0] [--json OUT]

Batch: `--sequences` right-padded rows of `--width` tokens (tiny's RL: 16 episodes, rows rounded up to 1,024
columns, at most 3,072), with lengths drawn uniformly from `--lengths lo:hi` (seeded; tiny's rollouts average
1,300-2,000 tokens) or listed; the second half of each sequence is sampled tokens. Printed: the rows and share of
real tokens of each layout, the median step seconds and real tokens/s of each over `--pairs` interleaved rounds
(compilation excluded), and the speed-up of the medians and the median of the pairs' ratios.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from bench_util import interleaved_step_times, loadavg


def rl_batch(lengths, width: int, vocab: int, seed: int) -> dict[str, np.ndarray]:
    """Right-padded [N, width] input_ids / attention_mask / action_mask / old_logprobs and [N] advantages."""
    rng = np.random.default_rng(seed)
    n = len(lengths)
    cols = np.arange(width)[None, :]
    lengths = np.asarray(lengths)[:, None]
    att = (cols < lengths).astype(np.int32)
    act = ((cols >= lengths // 2) & (cols < lengths)).astype(np.int32)
    return {"input_ids": (rng.integers(1, vocab, (n, width)) * att).astype(np.int32), "attention_mask": att,
            "action_mask": act, "old_logprobs": (rng.normal(-2.0, 0.5, (n, width)) * act).astype(np.float32),
            "advantages": rng.normal(0.0, 1.0, n).astype(np.float32)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--sequences", type=int, default=16)
    ap.add_argument("--width", type=int, default=3072)
    ap.add_argument("--lengths", default="1000:2600", help="lo:hi (uniform, seeded) or a comma list")
    ap.add_argument("--accum", type=int, default=4)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    import jax

    from hat_jax.model import Qwen3_5MoeForCausalLM, get_config, init_params
    from hat_jax.train.optim import OptimConfig, make_optimizer
    from hat_jax.train.policy_packing import pack_policy_batch
    from hat_jax.train.rl_loss import make_rl_train_step, rl_loss_fn
    from hat_jax.train.trainer import init_train_state, place_state, split_micro_batches

    if ":" in args.lengths:
        lo, hi = (int(v) for v in args.lengths.split(":"))
        lengths = np.random.default_rng(args.seed).integers(lo, hi + 1, args.sequences)
    else:
        lengths = np.asarray([int(v) for v in args.lengths.split(",")])
    config = get_config(args.preset)
    host = rl_batch(lengths, args.width, config.vocab_size, args.seed)
    packed = pack_policy_batch(host, aggregation="token-mean", rows_multiple=args.accum)
    if packed is None:
        raise SystemExit(f"packing saves no row for these lengths ({sorted(lengths.tolist())}, width {args.width}, "
                         f"rows a multiple of {args.accum})")
    model = Qwen3_5MoeForCausalLM(config, router_stats=True)
    optimizer = make_optimizer(OptimConfig(lr=1e-5).resolve(100))
    step = make_rl_train_step(rl_loss_fn(model, mtp=True), optimizer, accum_steps=args.accum, lb_coef=0.001,
                              mtp_coef=0.1)
    arms = {"unpacked": host, "packed": packed}
    runs = {}
    for name, batch in arms.items():
        keys = [k for k in batch if k != "attention_mask" or name == "unpacked"]
        micro = {k: jax.numpy.asarray(v) for k, v in split_micro_batches(batch, args.accum, keys).items()}
        runs[name] = [step, place_state(init_train_state(init_params(config, jax.random.key(0)), optimizer,
                                                         jax.random.key(1))), micro]
    times, median = interleaved_step_times(runs, args.pairs)
    real = int(host["attention_mask"].sum())
    report = {"preset": args.preset, "width": args.width, "lengths": lengths.tolist(), "real_tokens": real,
              "rows": {k: int(len(v["input_ids"])) for k, v in arms.items()},
              "slot_fill": {k: real / float(np.size(v["input_ids"])) for k, v in arms.items()},
              "pairs": args.pairs, "load": loadavg(), "step_s": times, "median_step_s": median,
              "median_real_tokens_per_s": {k: real / v for k, v in median.items()},
              "speedup": median["unpacked"] / median["packed"],
              "median_pair_speedup": float(np.median(np.divide(times["unpacked"], times["packed"])))}
    for k in arms:
        print(f"{k:>9}: {report['rows'][k]} rows x {args.width}, {100 * report['slot_fill'][k]:.0f}% real tokens; "
              f"median {median[k]:.2f} s/step, {report['median_real_tokens_per_s'][k]:.0f} real tok/s  "
              f"({', '.join(f'{t:.2f}' for t in times[k])})")
    print(f"packed / unpacked: {report['speedup']:.2f}x of the medians, {report['median_pair_speedup']:.2f}x median "
          f"over the pairs; {real} real tokens in {len(lengths)} sequences; load {report['load']}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
