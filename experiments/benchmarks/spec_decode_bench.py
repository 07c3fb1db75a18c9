"""CPU decode throughput with and without MTP speculative decoding (`SamplingConfig(num_speculative_tokens=k)`),
greedy, on one checkpoint or a fresh random model. A script that prints figures (not a test).

    .venv/bin/python experiments/benchmarks/spec_decode_bench.py [--checkpoint DIR | --preset tiny]
        [--drafter perfect] [--k 3] [--batches 1 2 4 8] [--prompt-len 32] [--new-tokens 64] [--reps 3] [--json OUT]
        [--prompts live_qa [--groups 4]]

What is measured: for each batch size B, `hat_jax.model.sampler.generate` (one jit: prefill + decode loop) with
k = 0 and with k = `--k`, on the same B prompts (no stop token, so every row decodes `--new-tokens` tokens).
The prompts are random tokens (`--prompt-len`), or with `--prompts live_qa` (a checkpoint with its tokenizer/
folder) the generation prompts of held-out Live QA episodes (`hat_jax.eval.mtp_acceptance.live_qa_oracle_episodes`
cut before the first assistant token: the system prompt, harness and viewer message, as the agent sees them),
left-padded; `--groups G` runs G disjoint groups of B prompts and sums their times and tokens. Each configuration runs once untimed (compilation), then `--reps` timed runs
in interleaved rounds (prefill-only, k = 0, k = `--k`, then again: a shared machine's load drifts over the three
alike) and the fastest of each counts (on a shared machine the minimum is the least disturbed). Every call, the
untimed one included, is waited for (`jax.block_until_ready` on its whole result) before the clock is read, so no
run spills into the next one's time. Decode time = that minus the fastest prefill-only call (max_new_tokens = 1), so decode tokens/s =
B * (N - 1) / decode time (nan when the noise leaves no positive difference: the table is then followed by a hint
to raise --reps or --new-tokens). The greedy tokens of the two runs
are compared (they must be identical) and the speculative run's acceptance is reported: acceptance rate =
accepted drafts / (verify steps * k), mean accepted length = 1 + accepted / steps (tokens per verify step).

Measured (the tiny `table6_both` final checkpoint, HSA-SFT then HSA-RL, seed 0; `--prompts live_qa --groups 2
--k 3`, 876-1,409-token prompts, 64 new tokens, fastest of 3, 2 idle cores):
    B   plain tok/s   spec tok/s   speedup   acceptance   mean accepted length   identical
    1         904.3        751.3     0.83x        0.717                   3.15        yes
    2        1289.9       1058.0     0.82x        0.717                   3.15        yes
    4        1714.3       1340.2     0.78x        0.723                   3.17        yes
    8        2005.1       1379.8     0.69x        0.720                   3.16        yes
The drafts are good (3.15 tokens per verifying forward) but on a CPU the tiny model's decode step is compute-
bound, not bound by reading the weights: verifying 4 positions and running the MTP block 3 times costs ~3.8 plain
steps, so speculation loses here (it pays where a step is weight-bandwidth-bound: GPU/TPU at small B). The 64
tokens run past the reply's end (no stop token, so both runs decode the same count).

A random-init model's MTP block accepts almost nothing: that is the overhead case (each step verifies k + 1
positions and runs the MTP k times to emit one token). `--drafter perfect` rewrites a random model so that its
MTP block is an exact drafter (residual branches zeroed, MTP fc passing the token embedding through; the same
construction as tests/model/test_speculative.py): the upper bound, every draft accepted (a synthetic model).
"""

from __future__ import annotations

import argparse
import json
import math
import time

from bench_util import loadavg

from hat_jax.cli_types import int_in, positive_int
from hat_jax.model.config import PRESETS


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


def timed(fns: dict, reps: int) -> tuple[dict[str, float], dict[str, object]]:
    """Times argument-free calls: each once untimed (its compilation), then `reps` interleaved rounds (every
    function once per round, in the dict's order, so that a shared machine's load drifts over all alike).

    Every call's whole result is waited for (`jax.block_until_ready`) before the clock is read: JAX dispatches
    asynchronously, so a call left running (the first run after compilation takes far longer than later ones)
    would be counted in the next call's time.

    Args:
        fns: {name: fn}, fn() -> a pytree of arrays. reps: timed rounds, >= 1.
    Returns:
        ({name: fastest of its `reps` timed calls, in seconds}, {name: its last result}).
    Raises:
        ValueError: reps < 1.
    """
    import jax

    if reps < 1:
        raise ValueError(f"timed: reps: expected an int >= 1, got {reps!r}")
    for fn in fns.values():
        jax.block_until_ready(fn())
    times, outs = {name: [] for name in fns}, {}
    for _ in range(reps):
        for name, fn in fns.items():
            t = time.perf_counter()
            outs[name] = jax.block_until_ready(fn())
            times[name].append(time.perf_counter() - t)
    return {name: min(v) for name, v in times.items()}, outs


def live_qa_prompts(checkpoint: str, count: int) -> list:
    """The generation prompts ([P] int32 each) of the first `count` held-out Live QA oracle episodes, rendered
    with the checkpoint's tokenizer: each episode cut before its first generated (loss-mask 1) token."""
    import numpy as np

    from hat_jax.data.world_data import WorldDataConfig
    from hat_jax.eval.mtp_acceptance import live_qa_oracle_episodes
    from hat_jax.rollout.checkpoint import tokenizer_from_checkpoint
    from hat_jax.tokenizer import load_tokenizer

    folder = tokenizer_from_checkpoint(checkpoint)
    if folder is None:
        raise SystemExit(f"error: --prompts live_qa: {checkpoint!r} has no tokenizer/ folder (in it or its parent)")
    episodes = live_qa_oracle_episodes(load_tokenizer(folder), WorldDataConfig(eval_items=count))
    prompts = [ids[:int(np.argmax(mask))] for ids, mask in episodes]
    if len(prompts) < count:
        raise SystemExit(f"error: --prompts live_qa: {len(prompts)} episodes, {count} needed (batch x --groups)")
    return prompts[:count]


def bench_batch(params, config, b: int, args, prompts: list | None = None) -> dict:
    """One row of the table for batch size b: `args.groups` groups of b prompts (random ones when `prompts` is
    None), their fastest times summed."""
    import jax
    import numpy as np

    from hat_jax.model.sampler import generate, left_pad
    from hat_jax.model.sampling import SamplingConfig

    totals = {"prefill_s": 0.0, "plain_s": 0.0, "spec_s": 0.0}
    steps = acc = 0
    identical = True
    for g in range(args.groups):
        if prompts is None:
            ids = np.random.RandomState(b * 1000 + g).randint(3, config.vocab_size, size=(b, args.prompt_len))
            ids, mask = ids.astype(np.int32), np.ones((b, args.prompt_len), bool)
        else:
            ids, mask = left_pad([p.tolist() for p in prompts[g * b:(g + 1) * b]], config.pad_token_id)
        run = lambda n, k: (lambda: generate(params, config, ids, mask, jax.random.key(0),
                                             SamplingConfig(max_new_tokens=n, num_speculative_tokens=k)))
        fastest, outs = timed({"prefill_s": run(1, 0), "plain_s": run(args.new_tokens, 0),
                               "spec_s": run(args.new_tokens, args.k)}, args.reps)
        totals = {name: totals[name] + fastest[name] for name in totals}
        plain, spec = outs["plain_s"], outs["spec_s"]
        steps, acc = steps + int(np.sum(spec.verify_steps)), acc + int(np.sum(spec.accepted_drafts))
        identical &= bool(np.array_equal(np.asarray(plain.tokens), np.asarray(spec.tokens)))
    decode = args.groups * b * (args.new_tokens - 1)
    prefill = totals["prefill_s"]
    rate = lambda t: decode / (t - prefill) if t > prefill else float("nan")
    plain_tps, spec_tps = rate(totals["plain_s"]), rate(totals["spec_s"])
    return {"batch": b, "plain_tok_s": plain_tps, "spec_tok_s": spec_tps, "speedup": spec_tps / plain_tps,
            "identical": identical, "acceptance": acc / max(steps * args.k, 1),
            "mean_accepted_length": 1 + acc / max(steps, 1), **totals}


def table_lines(rows: list[dict], reps: int) -> list[str]:
    """The printed table of `bench_batch` rows (header first), followed by a hint line when a figure is nan (the
    timing noise exceeded the decode time: more --reps, or more --new-tokens, make the fastest run cleaner)."""
    lines = [f"{'B':>3} {'plain tok/s':>12} {'spec tok/s':>11} {'speedup':>8} {'accept':>7} {'mean len':>9} identical"]
    for r in rows:
        lines.append(f"{r['batch']:>3} {r['plain_tok_s']:>12.1f} {r['spec_tok_s']:>11.1f} {r['speedup']:>7.2f}x "
                     f"{r['acceptance']:>7.3f} {r['mean_accepted_length']:>9.2f} {r['identical']}")
    if any(math.isnan(r[key]) for r in rows for key in ("plain_tok_s", "spec_tok_s", "speedup")):
        lines.append(f"hint: nan = a run was not slower than the prefill-only call (timing noise larger than the "
                     f"decode time); rerun with a larger --reps (now {reps}) or more --new-tokens")
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (module docstring); a bad value exits through argparse naming its option."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", help="a model checkpoint directory (default: a fresh --preset model)")
    ap.add_argument("--preset", default="tiny", choices=sorted(PRESETS),
                    help="the model config of a fresh random model (without --checkpoint)")
    ap.add_argument("--drafter", choices=("mtp", "perfect"), default="mtp",
                    help="perfect: rewrite the model so its MTP block drafts exactly (module docstring)")
    ap.add_argument("--k", type=positive_int, default=3,
                    help="num_speculative_tokens of the speculative runs, >= 1 (k = 0 is the plain baseline), "
                         "< --new-tokens")
    ap.add_argument("--batches", type=positive_int, nargs="+", default=[1, 2, 4, 8], help="batch sizes, >= 1")
    ap.add_argument("--prompt-len", type=positive_int, default=32, help="random prompts' length, >= 1")
    ap.add_argument("--new-tokens", type=int_in(2), default=64,
                    help="tokens decoded per row, >= 2 (the first comes from the prefill)")
    ap.add_argument("--reps", type=positive_int, default=3, help="timed runs per configuration (the fastest), >= 1")
    ap.add_argument("--prompts", choices=("random", "live_qa"), default="random",
                    help="live_qa: held-out Live QA generation prompts (needs --checkpoint with its tokenizer)")
    ap.add_argument("--groups", type=positive_int, default=1,
                    help="disjoint groups of B prompts per batch size, summed")
    ap.add_argument("--json", help="write the rows as JSON to this file")
    args = ap.parse_args(argv)
    if args.prompts == "live_qa" and not args.checkpoint:
        ap.error("--prompts live_qa needs --checkpoint (its tokenizer renders the prompts)")
    if args.k >= args.new_tokens:
        ap.error(f"--k {args.k}: a verify step emits at most --new-tokens - 1 = {args.new_tokens - 1} tokens after "
                 "the first; expected --k < --new-tokens")
    return args


def main(argv: list[str] | None = None) -> None:
    """Runs the benchmark (module docstring) and prints the table; `argv` as `parse_args`."""
    args = parse_args(argv)

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
    prompts = live_qa_prompts(args.checkpoint, max(args.batches) * args.groups) if args.prompts == "live_qa" else None
    rows = [bench_batch(params, config, b, args, prompts) for b in args.batches]
    what = (f"live_qa prompts ({min(map(len, prompts))}-{max(map(len, prompts))} tokens)" if prompts
            else f"random prompts of {args.prompt_len}")
    print(f"spec decode, {source}, k={args.k}, {what}, {args.groups} group(s) per B, {args.new_tokens} new tokens, "
          f"fastest of {args.reps}, load {loadavg()}")
    print("\n".join(table_lines(rows, args.reps)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"source": source, "k": args.k, "prompts": args.prompts, "groups": args.groups,
                       "prompt_len": args.prompt_len, "new_tokens": args.new_tokens, "load": loadavg(), "rows": rows},
                      f, indent=1)


if __name__ == "__main__":
    main()
