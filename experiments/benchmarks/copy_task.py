"""How fast does a freshly initialised model learn to copy from its context? A script that prints figures.

    .venv/bin/python experiments/benchmarks/copy_task.py [--preset tiny] [--steps 300] [--lr 1e-3]
        [--length 32] [--alphabet 54] [--batch 16] [--gdn-out-std 0.0 0.02] [--set num_hidden_layers=2 ...]
        [--task copy|span] [--lm-head-init normal|embedding]

The task is the textbook induction probe: a row is [BOS] x_1..x_L [SEP] x_1..x_L with x drawn uniformly from
`--alphabet` token ids, and the loss is the cross-entropy on the copied half x_1..x_L. Each x_i must be found
by matching the previous token (SEP standing for BOS before x_1) in the first half, so a model
solves it only once it reads its context; "copy accuracy" is the share of those tokens that are the argmax.
Run once per `--gdn-out-std`: the init std of every Gated DeltaNet `out_proj` (0.0 is hat-jax's init,
`hat_jax.model.params.INIT_SCHEME`; 0.02 = `initializer_range` is transformers' `_init_weights`). Training:
AdamW (weight decay 0.01), global-norm clip 1.0, 10 warmup steps (half the run when shorter) then cosine to
lr/10, fp32, one seed.

Measured (tiny config: 8 layers, 6 Gated DeltaNet + 2 attention; defaults: 300 steps, lr 1e-3, L 32, alphabet
54, batch 16; 2 idle CPU cores, ~2 min per run), copy accuracy at steps 100 / 200 / 299:
  out_proj std 0.02 (transformers' init)                                0.02 / 0.01 / 0.03 (0.06 at step 399)
  out_proj std 0.0  (hat-jax)                                           0.12 / 0.98 / 1.00
  out_proj std 0.002                                                    0.16 / 1.00 / 1.00
  GPT-2 rescale of every residual writer (out_proj, o_proj, expert
    down_proj x 1/sqrt(2 x 8 layers); made by hand, not a flag here)    0.02 / 0.09 / 0.63
  zero out_proj, o_proj and expert down_proj (fla's "zero" strategy)    0.02 / 0.01 / 0.05
  8 attention layers (--set full_attention_interval=1), std 0.02        0.06 / 0.77 / 1.00
The same run (std 0.0, 400 steps) with more distinct tokens to copy, `--alphabet 400` / `--alphabet 3000`: copy
accuracy 0.00 / 0.00 at step 200 and 0.07 / 0.00 at step 399 (loss 5.62 / 8.01): each token's embedding and
unembedding must be trained for it to be copied, so a copy over thousands of rarely seen tokens (a BPE's merged
product names) comes far later than over a few dozen (docs/tuning.md, "Copying rare tokens").
The span task (`--task span --batch 64 --gdn-out-std 0.0`; 2 cores, ~3 min per 300 steps), the share of rows
whose first copied token is right: `--alphabet 400` 0.88 at step 100 and 1.00 from step 125; `--alphabet 3000`
0.00 up to step 399; `--alphabet 3000 --lm-head-init embedding` 0.30 / 0.88 / 0.66 / 1.00 / 1.00 at steps
50 / 75 / 100 / 200 / 299.
With the lm_head started as the embedding's transpose a token is scored highest for itself from the first step, so
once the model finds where the name stands it copies any of the 3,000 tokens; with transformers' init each token's
output row must first train against its embedding, and rows seen a few times each never do within 400 steps.
At init a Gated DeltaNet layer writes a unit-RMS (its gated RMSNorm) mixture of the previous tokens into the
residual stream: with transformers' init each of the 6 adds RMS 0.022 against the embedding's 0.020, and the
token identities that attention must match are buried. Zero-initialised, the branch starts as the identity.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from hat_jax.cli_types import positive_int


def _parse_set(items):
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set {item!r}: expected field=value")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def copy_batch(rng, batch: int, length: int, alphabet: int, first_id: int = 10):
    """int32 [batch, 2 * length + 2]: [BOS=5] x [SEP=7] x, x uniform over ids first_id .. first_id+alphabet-1."""
    import numpy as np

    x = rng.integers(first_id, first_id + alphabet, (batch, length))
    return np.concatenate([np.full((batch, 1), 5), x, np.full((batch, 1), 7), x], 1).astype(np.int32)


# The span task's frames: filler token ids (after the alphabet) before and after the wrapped name.
_SPAN_HEADS = ((), (0,), (1, 2), (3, 4, 5), (6, 7), (8,), (9, 10, 11, 12), (13, 14))
_SPAN_TAILS = ((20, 21), (22,), (23, 24, 25), (26,))
SPAN_OBJECTS, SPAN_WIDTH = 20, 16


def span_batch(rng, batch: int, alphabet: int, first_id: int = 10):
    """(ids, loss mask), int32 [batch, SPAN_WIDTH] each: [BOS=5] head name tail [SEP=7] name [EOS=8] [PAD=0...],
    the name a brand (uniform over `alphabet` ids from first_id) and an object (one of SPAN_OBJECTS ids after them),
    the head and tail one of 8 and 4 fixed filler sequences (ids after the objects); the mask covers the copied name
    and EOS. The brand is found by where it stands (after the head), not by a previous token it shares."""
    import numpy as np

    filler = first_id + alphabet + SPAN_OBJECTS
    ids, mask = np.zeros((batch, SPAN_WIDTH), np.int32), np.zeros((batch, SPAN_WIDTH), np.int32)
    for b in range(batch):
        name = [int(rng.integers(first_id, first_id + alphabet)), int(rng.integers(0, SPAN_OBJECTS)) + first_id + alphabet]
        head = [filler + i for i in _SPAN_HEADS[rng.integers(len(_SPAN_HEADS))]]
        tail = [filler + i for i in _SPAN_TAILS[rng.integers(len(_SPAN_TAILS))]]
        row = [5, *head, *name, *tail, 7, *name, 8]
        ids[b, :len(row)] = row
        mask[b, len(row) - 3:len(row)] = 1
    return ids, mask


def run(config, gdn_out_std: float, steps: int, lr: float, length: int, alphabet: int, batch: int, seed: int,
        log_every: int = 25, task: str = "copy", lm_head_init: str = "normal"):
    """Trains a fresh model (`init_params(..., lm_head_init=...)`) on the copy task (or the span task,
    `span_batch`); yields (step, loss, copy accuracy, seconds) every log_every steps (the span task: the share of
    rows whose first copied token, the brand, is the argmax)."""
    import flax
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from hat_jax.model.params import init_params
    from hat_jax.model.transformer import Qwen3_5MoeForCausalLM
    from hat_jax.train.losses import masked_token_ce_sum

    model = Qwen3_5MoeForCausalLM(config)
    params = flax.traverse_util.flatten_dict(init_params(config, jax.random.key(seed), lm_head_init=lm_head_init))
    keys = jax.random.split(jax.random.key(seed + 1), len(params))
    for key, path in zip(keys, list(params)):
        if path[-2:] == ("out_proj", "kernel"):
            params[path] = gdn_out_std * jax.random.normal(key, params[path].shape, params[path].dtype)
    params = flax.traverse_util.unflatten_dict(params)
    schedule = optax.warmup_cosine_decay_schedule(0.0, lr, min(10, steps // 2), steps, lr * 0.1)
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.01))
    opt_state = opt.init(params)
    width = 2 * length + 2
    # loss_mask [T] (token t predicted from t - 1): the whole copy x_1..x_L, positions length + 2 .. 2 length + 1.
    mask = jnp.zeros((width,), jnp.float32).at[length + 2:].set(1.0)

    def loss_fn(p, ids, loss_mask):
        logits = model.apply({"params": p}, ids, attention_mask=jnp.ones_like(ids)).logits
        nll, n = masked_token_ce_sum(logits, ids, loss_mask)
        hits = (logits[:, :-1].argmax(-1) == ids[:, 1:]).astype(jnp.float32)
        if task == "span":  # the first masked target of each row: the brand
            first = jnp.argmax(loss_mask[:, 1:], -1)
            return nll / n, jnp.take_along_axis(hits, first[:, None], 1).mean()
        return nll / n, (hits * loss_mask[:, 1:]).sum() / n

    @jax.jit
    def step(p, s, ids, loss_mask):
        (loss, acc), grads = jax.value_and_grad(loss_fn, has_aux=True)(p, ids, loss_mask)
        updates, s = opt.update(grads, s, p)
        return optax.apply_updates(p, updates), s, loss, acc

    def next_batch():
        if task == "span":
            return span_batch(rng, batch, alphabet)
        ids = copy_batch(rng, batch, length, alphabet)
        return ids, np.broadcast_to(np.asarray(mask), ids.shape)

    rng = np.random.default_rng(seed)
    start = time.perf_counter()
    for i in range(steps):
        params, opt_state, loss, acc = step(params, opt_state, *map(jnp.asarray, next_batch()))
        if i % log_every == 0 or i == steps - 1:
            yield i, float(loss), float(acc), time.perf_counter() - start


def main(argv=None) -> int:
    from hat_jax.model.params import LM_HEAD_INITS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="tiny", help="model config preset (hat_jax.model.config)")
    p.add_argument("--steps", type=positive_int, default=300)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--length", type=int, default=32, help="tokens to copy per row")
    p.add_argument("--alphabet", type=int, default=54, help="distinct token ids the rows are drawn from")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--task", choices=("copy", "span"), default="copy",
                   help="copy: repeat a row (induction); span: copy a name wrapped in a frame (its first token)")
    p.add_argument("--gdn-out-std", type=float, nargs="+", default=[0.0, 0.02],
                   help="Gated DeltaNet out_proj init std, one run each (0.0 = hat-jax, 0.02 = transformers)")
    p.add_argument("--lm-head-init", choices=LM_HEAD_INITS, default="normal",
                   help="the lm_head's init: transformers' normal, or the embedding's transpose")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="model config override")
    args = p.parse_args(argv)

    from bench_util import loadavg
    from hat_jax.model.config import get_config

    config = get_config(args.preset, **_parse_set(args.set))
    layers = "".join("A" if t == "full_attention" else "D" for t in config.layer_types)  # D = Gated DeltaNet
    if args.task == "span" and args.alphabet + SPAN_OBJECTS + 30 + 10 > config.vocab_size:
        p.error(f"--alphabet {args.alphabet}: the span task needs alphabet + {SPAN_OBJECTS + 40} <= vocab_size "
                f"({config.vocab_size})")
    length = f"L {args.length}, " if args.task == "copy" else ""
    print(f"{args.task} task: preset {args.preset} ({layers}), {length}alphabet {args.alphabet}, "
          f"batch {args.batch}, lr {args.lr}, lm_head init {args.lm_head_init}, load {loadavg()}")
    what = "copy accuracy" if args.task == "copy" else "first token"
    for std in args.gdn_out_std:
        for i, loss, acc, secs in run(config, std, args.steps, args.lr, args.length, args.alphabet, args.batch,
                                      args.seed, task=args.task, lm_head_init=args.lm_head_init):
            print(f"gdn_out_std {std:g}  step {i:4d}  loss {loss:.3f}  {what} {acc:.3f}  ({secs:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
