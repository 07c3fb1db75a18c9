"""CPU decode throughput with and without MTP speculative decoding (`SamplingConfig(num_speculative_tokens=k)`),
greedy, on one checkpoint or a fresh random model. A script that prints figures (not a test).

    .venv/bin/python experiments/benchmarks/spec_decode_bench.py [--checkpoint DIR | --preset tiny]
        [--drafter perfect] [--k 3] [--batches 1 2 4 8] [--prompt-len 32] [--new-tokens 64] [--reps 3] [--json OUT]

What is measured: for each batch size B, `hat_jax.model.sampler.generate` (one jit: prefill + decode loop) with
k = 0 and with k = `--k`, on the same B random prompts (no padding, no stop token, so every row decodes
`--new-tokens` tokens). Each configuration runs once untimed (compilation), then `--reps` timed runs
(the fastest, `block_until_ready`: on a shared machine the minimum is the least disturbed). Decode time = that
minus the fastest prefill-only call (max_new_tokens = 1), so decode tokens/s = B * (N - 1) / decode time
(nan when the noise leaves no positive difference). The greedy tokens of the two runs
are compared (they must be identical) and the speculative run's acceptance is reported: acceptance rate =
accepted drafts / (verify steps * k), mean accepted length = 1 + accepted / steps (tokens per verify step).

A random-init model's MTP block accepts almost nothing: that is the overhead case (each step verifies k + 1
positions and runs the MTP k times to emit one token). `--drafter perfect` rewrites a random model so that its
MTP block is an exact drafter (residual branches zeroed, MTP fc passing the token embedding through; the same
construction as tests/model/test_speculative.py): the upper bound, every draft accepted (a synthetic model).
"""

from __future__ import annotations

import argparse
import json
import time

from bench_util import loadavg


def perfect_drafter(params: dict, config) -> dict:
    """Residual branch outputs zeroed in the main model and the MTP block, MTP fc = [I; 0]: the MTP predicts
    exactly what the main model (now a function of the current token) predicts."""
    import jax
    import jax.numpy as jnp

    def zero_branch(path, a):
        name = jax.tree_util.keystr(path)
        return a * 0 if any(n in name for n in ("o_proj", "out_proj", "down_proj")) else a

    p = jax.tree_util.tree_map_with_path(zero_branch, params)
    h = config.hidden_size
    return {**p, "mtp": {**p["mtp"], "fc": {"kernel": jnp.concatenate([jnp.eye(h), jnp.zeros((h, h))], 0)}}}


def timed(fn, reps: int) -> tuple[float, object]:
    """(fastest of `reps` calls after one untimed call, in seconds; the last result)."""
    out = fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        out = fn()
        out.tokens.block_until_ready()
        times.append(time.perf_counter() - t)
    return min(times), out


def bench_batch(params, config, b: int, args) -> dict:
    import jax
    import numpy as np

    from hat_jax.model.sampler import SamplingConfig, generate

    rs = np.random.RandomState(b)
    ids = rs.randint(3, config.vocab_size, size=(b, args.prompt_len)).astype(np.int32)
    mask = np.ones_like(ids, bool)
    run = lambda n, k: (lambda: generate(params, config, ids, mask, jax.random.key(0),
                                         SamplingConfig(max_new_tokens=n, num_speculative_tokens=k)))
    prefill, _ = timed(run(1, 0), args.reps)
    plain_t, plain = timed(run(args.new_tokens, 0), args.reps)
    spec_t, spec = timed(run(args.new_tokens, args.k), args.reps)
    steps, acc = int(np.sum(spec.verify_steps)), int(np.sum(spec.accepted_drafts))
    decode = b * (args.new_tokens - 1)
    rate = lambda t: decode / (t - prefill) if t > prefill else float("nan")
    plain_tps, spec_tps = rate(plain_t), rate(spec_t)
    return {"batch": b, "plain_tok_s": plain_tps, "spec_tok_s": spec_tps, "speedup": spec_tps / plain_tps,
            "identical": bool(np.array_equal(np.asarray(plain.tokens), np.asarray(spec.tokens))),
            "acceptance": acc / max(steps * args.k, 1), "mean_accepted_length": 1 + acc / max(steps, 1),
            "prefill_s": prefill, "plain_s": plain_t, "spec_s": spec_t}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", help="a model checkpoint directory (default: a fresh --preset model)")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--drafter", choices=("mtp", "perfect"), default="mtp",
                    help="perfect: rewrite the model so its MTP block drafts exactly (module docstring)")
    ap.add_argument("--k", type=int, default=3, help="num_speculative_tokens")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", help="write the rows as JSON to this file")
    args = ap.parse_args()

    import jax

    from hat_jax.model import get_config, init_params
    from hat_jax.model.checkpoint_io import load_model_checkpoint

    if args.checkpoint:
        config, params = load_model_checkpoint(args.checkpoint)
        source = args.checkpoint
    else:
        config = get_config(args.preset)
        params, source = init_params(config, jax.random.key(0)), f"random {args.preset}"
    if args.drafter == "perfect":
        params, source = perfect_drafter(params, config), source + " (perfect drafter)"
    rows = [bench_batch(params, config, b, args) for b in args.batches]
    print(f"spec decode, {source}, k={args.k}, prompt {args.prompt_len}, {args.new_tokens} new tokens, "
          f"fastest of {args.reps}, load {loadavg()}")
    print(f"{'B':>3} {'plain tok/s':>12} {'spec tok/s':>11} {'speedup':>8} {'accept':>7} {'mean len':>9} identical")
    for r in rows:
        print(f"{r['batch']:>3} {r['plain_tok_s']:>12.1f} {r['spec_tok_s']:>11.1f} {r['speedup']:>7.2f}x "
              f"{r['acceptance']:>7.3f} {r['mean_accepted_length']:>9.2f} {r['identical']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"source": source, "k": args.k, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
                       "load": loadavg(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
