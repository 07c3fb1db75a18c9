"""Seconds per evaluation suite and episodes/s of `hat_jax.eval.evaluate` for the `tiny` model. A script that
prints figures (not a test).

    .venv/bin/python experiments/benchmarks/eval_bench.py [--items 8] [--ifeval-limit 8] [--mini 8]
        [--batch 8] [--bucket 256] [--new 64] [--if-new 64] [--turns 4] [--seq-len 3072] [--reps 2]
        [--ckpt RUN_DIR] [--ifeval-data PATH] [--dtype float32]

Model: random params of `get_config("tiny")` with a 4,096-token BPE trained here on the pretraining corpus
and the eval items' rendered prompts (or, with --ckpt, a trained checkpoint and its tokenizer). A random
model almost never writes `<|im_end|>`, so each of its turns runs to the token limit and its episodes end
after one turn (cut): the figures are per-turn worst cases and turn-count best cases; a trained checkpoint
gives the real mix. IFEval reads --ifeval-data, else $HAT_IFEVAL_DATA, else is skipped.

Each repetition runs the whole `evaluate`; the first includes the sampler's compilations (one per batch
rows x prompt width x new-token count), later ones reuse them (the in-process jit cache). Printed per
suite: items, wall seconds, episodes (or prompts) per second, generated tokens per second; then the total.
The load average (/proc/loadavg) is printed: on a shared machine compare runs made under the same load.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
from pathlib import Path

from bench_util import loadavg


def bench_tokenizer(world, out_dir: Path):
    """A 4,096-token BPE over pretraining chats plus the eval items' first prompts (every suite)."""
    from hat_jax.data.corpus import tokenizer_training_texts
    from hat_jax.data.suites import SUITES, item_harness
    from hat_jax.data.world_data import eval_items
    from hat_jax.harness.render import render_text
    from hat_jax.sim.world_harness import world_harness
    from hat_jax.tokenizer import train_bpe_tokenizer

    original = world_harness(world.harness)
    bytes_only = train_bpe_tokenizer(["x"], 300, out_dir / "bytes")
    rendered = [render_text(bytes_only, item_harness(it, original), [{"role": "user", "content": it.task.message}],
                            True) for suite in SUITES for it in eval_items(suite, world)]
    return train_bpe_tokenizer(tokenizer_training_texts(200, 0, rendered), 4096, out_dir / "bpe")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--items", type=int, default=8, help="items per live-stream suite")
    ap.add_argument("--ifeval-limit", type=int, default=8)
    ap.add_argument("--mini", type=int, default=8, help="ifeval_mini prompts")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--bucket", type=int, default=256)
    ap.add_argument("--new", type=int, default=64, help="max new tokens per live turn")
    ap.add_argument("--if-new", type=int, default=64, help="max new tokens per IFEval completion")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=3072)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--ckpt", default=None, help="a trained checkpoint (run dir with tokenizer/) instead of random")
    ap.add_argument("--ifeval-data", default=None)
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)

    import jax

    from hat_jax.data.world_data import WorldDataConfig
    from hat_jax.eval import EvalConfig, evaluate
    from hat_jax.eval.runner import evaluate_checkpoint
    from hat_jax.model import get_config, init_params

    world = WorldDataConfig(sft_tasks=2000, rl_tasks=1000, eval_items=args.items)
    ifeval_data = args.ifeval_data or os.environ.get("HAT_IFEVAL_DATA")
    config = EvalConfig(world=world, max_new_tokens=args.new, max_turns=args.turns, seq_len=args.seq_len,
                        batch_size=args.batch, bucket=args.bucket, ifeval=bool(ifeval_data), ifeval_data=ifeval_data,
                        ifeval_limit=args.ifeval_limit, ifeval_mini_items=args.mini, if_max_new_tokens=args.if_new,
                        compute_dtype=args.dtype)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; loadavg {loadavg()}; {config}", flush=True)
    if args.ckpt:
        run = lambda: evaluate_checkpoint(args.ckpt, config, progress=False)  # noqa: E731
    else:
        t = time.perf_counter()
        tok = bench_tokenizer(world, Path(tempfile.mkdtemp(prefix="eval-bench-")))
        model_config = get_config("tiny")
        params = init_params(model_config, jax.random.key(0))
        print(f"setup (eval items, tokenizer of {len(tok)} tokens, init): {time.perf_counter() - t:.1f} s", flush=True)
        run = lambda: evaluate(config.sampler(params, model_config, tok), config, progress=False)  # noqa: E731
    for rep in range(args.reps):
        res = run()
        extra = res["extra"]
        print(f"\nrep {rep} ({'with compilations' if rep == 0 else 'warm'}); loadavg {loadavg()}")
        print(f"{'suite':<20s} {'n':>5s} {'wall_s':>8s} {'items/s':>8s} {'tok/s':>8s} {'turns':>6s} {'cut%':>6s}"
              "  scores")
        for name in (*config.suites, "ifeval", "ifeval_mini"):
            e = extra.get(name, {})
            if "wall_s" not in e:
                print(f"{name:<20s} skipped: {e.get('skipped')}")
                continue
            n = e.get("episodes", e.get("prompts"))
            tokens = e.get("tokens_generated", e.get("completion_tokens", 0) * n)
            gen_s = e.get("generation_s", e["wall_s"])
            print(f"{name:<20s} {n:5.0f} {e['wall_s']:8.2f} {n / e['wall_s']:8.3f} {tokens / gen_s:8.1f} "
                  f"{e.get('turns', 1):6.2f} {e['truncated_pct']:6.1f}  "
                  + " ".join(f"{k} {v:.1f}" for k, v in (res[name] or {}).items()), flush=True)
        print(f"{'total':<20s} {'':5s} {extra['wall_s']:8.2f}", flush=True)


if __name__ == "__main__":
    main()
