"""Can the model read a harness? The reading gauge (`hat_jax.data.reading_gauge`) trained and scored in the
project's chat format and tokenizer. A script that prints figures (not a test).

    .venv/bin/python experiments/benchmarks/reading_gauge.py [--train renamed] [--order label_first] [--steps 800]
        [--lr 1e-3] [--batch 32] [--preset tiny [--model-set FIELD=JSON] | --init CKPT] [--eval-every 100]
        [--eval-rows 256] [--json OUT] [--plot OUT.png]

--order name_first lists "- name: label" (a harness's order), read about 3x slower; --train anystyle trains on
names in every style; figures in docs/tuning.md ("What the gauge learns to copy").

A row lists 5 of the world's 8 intents with the tool name of each, asks for one by its label, and the assistant
turn calls that tool. The model (a fresh `--preset` model, or `--init` a checkpoint with its tokenizer/) trains on
rows of the `--train` families (one of fixed / renamed / heldout, or a comma list drawn per row: "fixed,renamed" is
HAT's mixture of original and perturbed harnesses) with the loss on the assistant turn; every --eval-every steps it
is scored on --eval-rows fixed rows of each family: exact = every token of the called name is the argmax under
teacher forcing, printed with its two parts (first / rest): the name's first token, which says whether the model
found the entry, and every later token, the copy of the rest of its name. AdamW (weight decay 0.01), global-norm
clip 1.0, 100 warmup steps (a tenth of the run when shorter), cosine to lr/10, fp32.

Without --init the tokenizer is the --preset base's BPE (`hat_jax.train.pretrain`'s, from the cache or trained on
first use), with that base's pre-tokenizer split unless --tokenizer-split names another. The curve is printed,
--json writes it, --plot draws it (matplotlib).

Measured (fresh tiny model, the defaults but --eval-rows 128; 2,083 s on 2 cores shared
with the test suite; docs/reading_gauge.png), exact at steps 200 / 400 / 600 / 800:
  renamed   0.016 / 0.211 / 0.391 / 0.758
  fixed     0.000 / 0.000 / 0.516 / 0.477   (world names, snake_case pieces of the training families)
  heldout   0.000 / 0.000 / 0.000 / 0.000   (PascalCase and dotted names: never written)
Rows are 90-125 tokens (the listing, the request, the call in the chat format). 25,600 rows seen to reach 76%
renamed, as many as the token-id probe of ../shared/probes needs for 77% (400 steps of 64 rows of 40 tokens): the
chat format and the BPE names do not slow the reading itself, they make each row ~2.7x longer. A name is written
after ": " in the list and after "=" in the call, so its first BPE token differs between the two; the held-out
styles are the trap the issue names (the model never emits a style it never wrote).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

from hat_jax.cli_types import positive_int


def model_setting(text: str) -> tuple[str, object]:
    """'FIELD=JSON' -> (FIELD, value): a model config override of --model-set."""
    field, sep, value = text.partition("=")
    try:
        if not sep or not field:
            raise ValueError
        return field, json.loads(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected FIELD=JSON, e.g. full_attention_interval=2") from None


def tokenizer_and_params(args):
    """(tokenizer, model config, params): --init's checkpoint, or a fresh --preset model with the preset's BPE
    (split as --tokenizer-split says, else as the preset's base; `args.tokenizer_split` is set to the split used)."""
    import jax

    from hat_jax.model import get_config, init_params
    from hat_jax.tokenizer import load_tokenizer

    if args.init:
        from hat_jax.model.checkpoint_io import load_model_checkpoint
        from hat_jax.rollout.checkpoint import tokenizer_from_checkpoint

        folder = tokenizer_from_checkpoint(args.init)
        if folder is None:
            raise SystemExit(f"error: --init {args.init!r} has no tokenizer/ folder (in it or its parent)")
        config, params = load_model_checkpoint(args.init)
        return load_tokenizer(folder), config, params
    from hat_jax.train.sft import bpe_tokenizer_dir
    from hat_jax.train.stage import stage_section

    base = stage_section(args.preset, "base.pretrain")
    config = get_config(base.preset, **{**dict(base.model_overrides), **dict(args.model_set)})
    args.tokenizer_split = args.tokenizer_split or base.tokenizer_split  # recorded with the curve
    folder = bpe_tokenizer_dir(config.vocab_size, base.tokenizer_texts, base.world, split=args.tokenizer_split)
    return load_tokenizer(folder), config, init_params(config, jax.random.key(args.seed))


def run(args, tokenizer, config, params):
    """Trains on the --train families; yields {step, loss, seconds, exact, first, rest} at every evaluation, each of
    the last three {family: share of the scored rows} (`hat_jax.data.reading_gauge.name_token_hits`: first = the
    name's first token right, rest = every later one right, exact = both)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from hat_jax.data.reading_gauge import FAMILIES, first_token_chance, gauge_batch, name_token_hits
    from hat_jax.model.transformer import Qwen3_5MoeForCausalLM
    from hat_jax.train.losses import masked_token_ce_sum

    model = Qwen3_5MoeForCausalLM(config)
    warmup = min(100, max(1, args.steps // 10))
    schedule = optax.warmup_cosine_decay_schedule(0.0, args.lr, warmup, max(args.steps, warmup + 1), args.lr * 0.1)
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.01))
    opt_state = opt.init(params)

    def loss_fn(p, batch):
        logits = model.apply({"params": p}, batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        nll, n = masked_token_ce_sum(logits, batch["input_ids"], batch["loss_mask"])
        return nll / n

    @jax.jit
    def step(p, s, batch):
        loss, grads = jax.value_and_grad(loss_fn)(p, batch)
        updates, s = opt.update(grads, s, p)
        return optax.apply_updates(p, updates), s, loss

    @jax.jit
    def argmax(p, ids, mask):
        return jnp.argmax(model.apply({"params": p}, ids, attention_mask=mask).logits, axis=-1)

    train = tuple(args.train.split(","))
    rng = random.Random(args.seed)
    evals = {f: gauge_batch(tokenizer, random.Random(10_000 + i), f, args.eval_rows, args.width, order=args.order)
             for i, f in enumerate(FAMILIES)}
    chance = {f: first_token_chance(tokenizer, random.Random(10_000 + i), f, args.eval_rows, order=args.order)
              for i, f in enumerate(FAMILIES)}  # the same rows
    print("first token by calling a listed tool at random: "
          + "  ".join(f"{f} {v:.3f}" for f, v in chance.items()), flush=True)

    def score():
        out = {"exact": {}, "first": {}, "rest": {}}
        for f, b in evals.items():
            hits = [name_token_hits(np.asarray(argmax(params, b["input_ids"][i:i + 64], b["attention_mask"][i:i + 64])),
                                    b["input_ids"][i:i + 64], b["name_mask"][i:i + 64])
                    for i in range(0, args.eval_rows, 64)]
            first, rest = (np.concatenate(h) for h in zip(*hits))
            out["exact"][f], out["first"][f], out["rest"][f] = (float(np.mean(x)) for x in (first & rest, first, rest))
        return out

    start, loss = time.perf_counter(), float("nan")
    for i in range(args.steps + 1):
        if i % args.eval_every == 0 or i == args.steps:
            yield {"step": i, "loss": loss, "seconds": round(time.perf_counter() - start, 1), **score()}
        if i == args.steps:
            break
        batch = gauge_batch(tokenizer, rng, train, args.batch, args.width, order=args.order)
        params, opt_state, loss = step(params, opt_state, {k: jnp.asarray(v) for k, v in batch.items()})
        loss = float(loss)


def plot(curve: list[dict], title: str, path: str) -> None:
    """Exact share per family against the step, saved to `path`."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"--plot {path}: matplotlib is not installed; the curve is in the table above", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for family in curve[0]["exact"]:
        ax.plot([c["step"] for c in curve], [c["exact"][family] for c in curve], marker="o", label=family)
    ax.set(xlabel="step", ylabel="names exact", ylim=(-0.02, 1.02), title=title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    from hat_jax.data.reading_gauge import ORDERS, TRAIN_FAMILIES
    from hat_jax.tokenizer import SPLIT_PATTERNS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--train", default="renamed",
                   help="training families: fixed, renamed, heldout, anystyle (every style, no reserved combination) "
                        "or a comma list")
    p.add_argument("--order", default="label_first", choices=ORDERS,
                   help="list entries as '- label: name' (the probe's form) or '- name: label' (a harness's form)")
    p.add_argument("--steps", type=positive_int, default=800)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch", type=positive_int, default=32)
    p.add_argument("--width", type=positive_int, default=160, help="tokens per row (rows are right-padded)")
    p.add_argument("--preset", default="tiny", help="pretraining preset whose model and tokenizer start fresh")
    p.add_argument("--init", help="start from this checkpoint (with its tokenizer/) instead")
    p.add_argument("--model-set", action="append", type=model_setting, default=[], metavar="FIELD=JSON",
                   help="a model config field of the fresh model, e.g. full_attention_interval=2 (repeatable)")
    p.add_argument("--tokenizer-split", choices=sorted(SPLIT_PATTERNS),
                   help="the fresh model's BPE pre-tokenizer split (hat_jax.tokenizer.SPLIT_PATTERNS); default: the "
                        "preset base's (qwen for tiny, scripts for small)")
    p.add_argument("--eval-every", type=positive_int, default=100)
    p.add_argument("--eval-rows", type=positive_int, default=256, help="scored rows per family")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the curve to this file")
    p.add_argument("--plot", help="draw the curve into this PNG")
    args = p.parse_args(argv)
    bad = [f for f in args.train.split(",") if f not in TRAIN_FAMILIES]
    if bad:
        p.error(f"--train {args.train!r}: {bad} not among {TRAIN_FAMILIES}")
    if args.init and args.model_set:
        p.error("--model-set changes a fresh model; --init loads its model from the checkpoint")
    if args.init and args.tokenizer_split:
        p.error("--tokenizer-split builds a fresh model's BPE; --init loads the checkpoint's tokenizer/")

    from bench_util import loadavg

    tokenizer, config, params = tokenizer_and_params(args)
    source = args.init or f"fresh {args.preset}" + "".join(f", {k}={v}" for k, v in args.model_set)
    print(f"reading gauge: {source}, train {args.train}, order {args.order}, {args.steps} steps, "
          f"batch {args.batch} x {args.width}, lr {args.lr}, load {loadavg()}", flush=True)
    curve = []
    for point in run(args, tokenizer, config, params):
        curve.append(point)
        exact = "  ".join(f"{f} {v:.3f} ({point['first'][f]:.2f} / {point['rest'][f]:.2f})"
                          for f, v in point["exact"].items())
        print(f"step {point['step']:5d}  loss {point['loss']:.3f}  exact (first / rest): {exact}  "
              f"({point['seconds']:.0f} s)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"source": source, "layer_types": list(config.layer_types),
                       "tokenizer_split": args.tokenizer_split, "train": args.train,
                       "order": args.order, "steps": args.steps, "batch": args.batch,
                       "width": args.width, "lr": args.lr, "load": loadavg(), "curve": curve}, f, indent=1)
    if args.plot:
        plot(curve, f"reading gauge: {source}, train {args.train}", args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
