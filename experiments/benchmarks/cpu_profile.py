"""Where the time goes on CPU for the `tiny` preset: the SFT train step, `generate`, and single layers.
A script that prints figures (not a test).

    .venv/bin/python experiments/benchmarks/cpu_profile.py [--paths train,generate,layers,prefill-layers,
        decode-layers] [--reps 5] [--batch 4] [--seq 1536] [--gen-rows 16] [--prompt 1400] [--new 96]
        [--moe-impl blocked] [--moe-impls blocked,dense] [--chunk-sizes 16,64] [--remat]

What is measured (random params from `init_params(get_config("tiny", vocab_size=--vocab))`, float32):
- train: the jitted SFT `train_step` (`hat_jax.train.trainer.make_train_step` over
  `hat_jax.train.sft.sft_loss_fn`, AdamW from `make_optimizer`, lb_coef 0.001, state donated) on one
  micro-batch of `--batch` rows x `--seq` tokens (every other row right-padded, loss on the second half).
- generate: `hat_jax.model.sampler.generate` on `--gen-rows` left-padded prompts of `--prompt` columns
  (rows up to 1/7 shorter), `--new` tokens, no stop ids (every row decodes all of them); greedy and
  temperature 1. Calls with max_new_tokens=1 (the prefill) and with `--new` alternate; the decode time
  per step is the median of their differences / (new - 1).
- layers / prefill-layers: one Gated DeltaNet layer (and its chunked kernel alone at each of
  `--chunk-sizes`), one gated attention layer, one MoE block per `--moe-impls`, fwd+bwd at the train shape
  (plus the lm_head + masked cross-entropy) or fwd only at the prefill shape [gen-rows, prompt].
- decode-layers: one cached decode step of the whole model and of single layers at the generate batch.
Each figure is the median of `--reps` timed calls after one untimed call (which compiles; printed as
`compile+1`), with `cpu` the median process CPU time (all threads) and `faults` / `sys` the minor page
faults and system CPU time per call.

Reading the figures on a shared 2-core machine: wall times follow the other processes' load
(/proc/loadavg is printed before and after); CPU time moves much less, compare that. XLA:CPU allocates
each execution's temporaries afresh, and glibc maps buffers over 32 MiB with mmap and unmaps them on
free, so every touched page faults again on each call (~680k faults, ~1 s of system time per train
step); LD_PRELOAD=libtcmalloc_minimal.so.4 (Debian libtcmalloc-minimal4) or
GLIBC_TUNABLES=glibc.malloc.hugetlb=1 removes most of it, which the `faults` column shows.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from bench_util import loadavg


CPU_TIMES: list[float] = []  # process CPU seconds (all threads) of the last `timeit`'s timed calls
FAULTS: list[tuple[float, float]] = []  # (minor page faults, system CPU seconds) per timed call


def _usage():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_minflt, r.ru_stime


def timeit(fn, reps: int) -> tuple[float, float, list[float]]:
    """(first call incl. compile, median wall time of `reps` calls, all wall times); fn must block on its
    result. The calls' process CPU times (all threads) go to CPU_TIMES: on a shared machine the CPU time
    of a call moves less with the load than its wall time."""
    t = time.perf_counter()
    fn()
    first = time.perf_counter() - t
    times = []
    CPU_TIMES.clear()
    FAULTS.clear()
    for _ in range(reps):
        t, c, (f0, s0) = time.perf_counter(), time.process_time(), _usage()
        fn()
        times.append(time.perf_counter() - t)
        CPU_TIMES.append(time.process_time() - c)
        f1, s1 = _usage()
        FAULTS.append((f1 - f0, s1 - s0))
    return first, statistics.median(times), times


def report(name: str, first: float, med: float, times: list[float], extra: str = "") -> None:
    spread = f"min {min(times):.3f} max {max(times):.3f}"
    cpu = statistics.median(CPU_TIMES)
    faults = ""
    if FAULTS:
        med_faults = statistics.median(f for f, _ in FAULTS) / 1e3
        faults = f"  faults {med_faults:6.0f}k sys {statistics.median(s for _, s in FAULTS):.2f} s"
    print(f"{name:<44s} median {med:8.3f} s  ({spread})  cpu {cpu:7.3f} s{faults}  compile+1 {first:7.2f} s"
          f"  {extra}", flush=True)


def block(tree):
    return jax.block_until_ready(tree)


# ----------------------------------------------------------------------------------------------- paths

def bench_train(config, params, args) -> None:
    from hat_jax.model.transformer import Qwen3_5MoeForCausalLM
    from hat_jax.train.optim import OptimConfig, make_optimizer
    from hat_jax.train.sft import sft_loss_fn
    from hat_jax.train.trainer import init_train_state, make_train_step, place_state

    rng = np.random.default_rng(0)
    b, t = args.batch, args.seq
    ids = rng.integers(3, config.vocab_size, (b, t)).astype(np.int32)
    att = np.ones((b, t), np.int32)
    for row in range(0, b, 2):  # every other row right-padded by up to a quarter
        att[row, t - rng.integers(1, t // 4):] = 0
    ids = np.where(att > 0, ids, 0)
    loss_mask = att.copy()
    loss_mask[:, : t // 2] = 0
    loss_mask[:, 0] = 0
    batch = {k: jnp.asarray(v[None]) for k, v in
             (("input_ids", ids), ("attention_mask", att), ("loss_mask", loss_mask))}
    model = Qwen3_5MoeForCausalLM(config, moe_impl=args.moe_impl, remat_policy="full" if args.remat else "none")
    opt = make_optimizer(OptimConfig(lr=1e-3, total_steps=1000, weight_decay=0.01))
    step = make_train_step(sft_loss_fn(model), opt, lb_coef=0.001)
    holder = {"s": place_state(init_train_state(params, opt, jax.random.key(0)))}

    def one():
        holder["s"], metrics = step(holder["s"], batch)
        block(metrics)

    first, med, times = timeit(one, args.reps)
    report(f"train step {b}x{t} (moe={args.moe_impl}, remat={args.remat})", first, med, times,
           f"{b * t / med:8.0f} tok/s")


def _prompts(config, rows: int, length: int, seed: int = 1):
    from hat_jax.model.sampler import left_pad
    rng = np.random.default_rng(seed)
    lens = [length - int(rng.integers(0, max(1, length // 7))) for _ in range(rows)]
    seqs = [rng.integers(3, config.vocab_size, n).tolist() for n in lens]
    return left_pad(seqs, 0, length)


def bench_generate(config, params, args) -> None:
    """Prefill-only and full calls alternate, so that the decode time (their difference, per pair) sees
    the same load on both sides."""
    from hat_jax.model.sampler import generate
    from hat_jax.model.sampling import SamplingConfig

    ids, mask = _prompts(config, args.gen_rows, args.prompt)
    ids, mask = jnp.asarray(ids), jnp.asarray(mask)
    key = jax.random.key(0)
    rows, new = args.gen_rows, args.new
    run = lambda s: block(generate(params, config, ids, mask, key, s, moe_impl=args.moe_impl))
    for temp in (0.0, 1.0):
        prefill = SamplingConfig(temperature=temp, max_new_tokens=1)
        full = SamplingConfig(temperature=temp, max_new_tokens=new)
        t0 = time.perf_counter()
        run(prefill)
        f_pre = time.perf_counter() - t0
        run(full)
        f_full = time.perf_counter() - t0 - f_pre
        pre, tot, cpu_pre, cpu_tot, faults_pre, faults_tot = [], [], [], [], [], []
        for _ in range(args.reps):
            for s, wall, cpu, faults in ((prefill, pre, cpu_pre, faults_pre), (full, tot, cpu_tot, faults_tot)):
                t, c, (f0, s0) = time.perf_counter(), time.process_time(), _usage()
                run(s)
                wall.append(time.perf_counter() - t)
                cpu.append(time.process_time() - c)
                f1, s1 = _usage()
                faults.append((f1 - f0, s1 - s0))
        med = statistics.median
        dec = med([b - a for a, b in zip(pre, tot)])
        dec_cpu = med([b - a for a, b in zip(cpu_pre, cpu_tot)])
        CPU_TIMES[:], FAULTS[:] = cpu_pre, faults_pre
        report(f"prefill {rows}x{args.prompt} T={temp} (generate, 1 token)", f_pre, med(pre), pre,
               f"{rows * args.prompt / med(pre):6.0f} prompt tok/s")
        CPU_TIMES[:], FAULTS[:] = cpu_tot, faults_tot
        report(f"generate {rows}x{args.prompt}+{new} T={temp}", f_full, med(tot), tot,
               f"{rows * new / med(tot):6.0f} sampled tok/s; decode {1e3 * dec / (new - 1):.1f} ms/step "
               f"({rows * (new - 1) / max(dec, 1e-9):.0f} tok/s), cpu {1e3 * dec_cpu / (new - 1):.1f} ms/step")


# ----------------------------------------------------------------------------------------------- layers

def _layer_fn(module, variables, inputs, backward: bool):
    """jitted fwd (sum of the output) or fwd+bwd (grads w.r.t. params and the first input)."""
    def loss(p, x, *rest):
        out = module.apply({"params": p}, x, *rest)
        out = out[0] if isinstance(out, tuple) else out
        return jnp.sum(out.astype(jnp.float32))

    f = jax.jit(jax.grad(loss, argnums=(0, 1)) if backward else loss)
    return lambda: block(f(variables["params"], *inputs))


def bench_layer_table(config, params, args, b: int, t: int, backward: bool) -> None:
    from hat_jax.model.attention import GatedAttention
    from hat_jax.model.deltanet import GatedDeltaNet, chunk_gated_delta_rule
    from hat_jax.model.moe import SparseMoeBlock
    from hat_jax.model.rope import rope_cos_sin

    what = "fwd+bwd" if backward else "fwd"
    print(f"-- single layers, {what}, {b}x{t}", flush=True)
    h = config.hidden_size
    key = jax.random.key(1)
    x = jax.random.normal(key, (b, t, h), jnp.float32)
    mask = jnp.ones((b, t), bool)

    gdn = GatedDeltaNet(config)
    v = gdn.init(key, x[:, :8], mask[:, :8])
    report(f"GDN layer {what}", *timeit(_layer_fn(gdn, v, (x, mask), backward), args.reps))

    hv, dk, dv = config.linear_num_value_heads, config.linear_key_head_dim, config.linear_value_head_dim
    ks = jax.random.split(key, 5)
    q = jax.random.normal(ks[0], (b, t, hv, dk)) * 0.1
    k = jax.random.normal(ks[1], (b, t, hv, dk))
    k = k / jnp.linalg.norm(k, axis=-1, keepdims=True)
    vv = jax.random.normal(ks[2], (b, t, hv, dv))
    g = -jax.nn.softplus(jax.random.normal(ks[3], (b, t, hv)))
    beta = jax.nn.sigmoid(jax.random.normal(ks[4], (b, t, hv)))
    s0 = jnp.zeros((b, hv, dk, dv))
    for cs in args.chunk_sizes:
        fn = lambda q, k, v, g, be, cs=cs: jnp.sum(chunk_gated_delta_rule(q, k, v, g, be, s0, cs)[0])
        kern = jax.jit(jax.grad(fn, argnums=(0, 1, 2, 3, 4)) if backward else fn)
        report(f"  chunk_gated_delta_rule {what} (C={cs})", *timeit(lambda: block(kern(q, k, vv, g, beta)), args.reps))

    pos = jnp.broadcast_to(jnp.arange(t), (b, t))
    cos, sin = rope_cos_sin(pos, config.rotary_dim, config.rope_parameters.rope_theta)
    seg = mask.astype(jnp.int32)  # one segment per row: the causal mask
    attn = GatedAttention(config)
    v = attn.init(key, x[:, :8], cos[:, :8], sin[:, :8], seg[:, :8], seg[:, :8])
    report(f"attention layer {what}", *timeit(_layer_fn(attn, v, (x, cos, sin, seg, seg), backward), args.reps))

    for impl in args.moe_impls:
        moe = SparseMoeBlock(config, impl=impl)
        v = moe.init(key, x[:, :8])
        report(f"MoE block {what} ({impl})", *timeit(_layer_fn(moe, v, (x,), backward), args.reps))

    if backward:
        from hat_jax.train.losses import masked_token_ce_sum
        ids = jax.random.randint(key, (b, t), 0, config.vocab_size)
        lmask = jnp.ones((b, t), jnp.int32)
        kernel = params["lm_head"]["kernel"]

        def head_loss(kernel, x):
            logits = jnp.dot(x.reshape(-1, h), kernel).reshape(b, t, -1)
            return masked_token_ce_sum(logits, ids, lmask)[0]

        hg = jax.jit(jax.grad(head_loss, argnums=(0, 1)))
        report(f"lm_head + CE {what}", *timeit(lambda: block(hg(kernel, x)), args.reps))


def bench_decode_step(config, params, args) -> None:
    """One cached decode step of the whole model and of single layers at the generate batch."""
    from hat_jax.model.attention import GatedAttention
    from hat_jax.model.cache import init_cache
    from hat_jax.model.deltanet import GatedDeltaNet
    from hat_jax.model.moe import SparseMoeBlock
    from hat_jax.model.rope import rope_cos_sin
    from hat_jax.model.transformer import Qwen3_5MoeForCausalLM

    rows, total = args.gen_rows, args.prompt + args.new
    print(f"-- one decode step, {rows} rows, cache {total} slots", flush=True)
    cache = init_cache(config, rows, total)
    cache["index"] = jnp.int32(args.prompt)
    cache["valid"] = cache["valid"].at[:, : args.prompt].set(True)
    tok = jnp.ones((rows, 1), jnp.int32)
    for impl in args.moe_impls:
        model = Qwen3_5MoeForCausalLM(config, moe_impl=impl)

        @jax.jit
        def step(params, tok, cache):
            out = model.apply({"params": params}, tok, attention_mask=jnp.ones_like(tok, bool), cache=cache,
                              return_logits=False)
            return model.apply({"params": params}, out.hidden[:, -1], method=lambda m, h: m.lm_head(h)), out.cache

        report(f"decode step, whole model ({impl})", *timeit(lambda: block(step(params, tok, cache)), args.reps))

    key = jax.random.key(1)
    x = jax.random.normal(key, (rows, 1, config.hidden_size), jnp.float32)
    gdn = GatedDeltaNet(config)
    gcache = cache["layers"][0]
    v = gdn.init(key, x, None, gcache)
    f = jax.jit(lambda p, x, c: gdn.apply({"params": p}, x, None, c))
    report("  GDN layer decode", *timeit(lambda: block(f(v["params"], x, gcache)), args.reps))
    attn = GatedAttention(config)
    acache = cache["layers"][config.layer_types.index("full_attention")]
    pos = jnp.full((rows, 1), args.prompt)
    cos, sin = rope_cos_sin(pos, config.rotary_dim, config.rope_parameters.rope_theta)
    q_seg = jnp.ones((rows, 1), jnp.int32)
    kv_seg = (jnp.arange(total) <= args.prompt)[None, :].repeat(rows, 0).astype(jnp.int32)
    idx = jnp.int32(args.prompt)
    v = attn.init(key, x, cos, sin, q_seg, kv_seg, acache, idx)
    f = jax.jit(lambda p, x, c, i: attn.apply({"params": p}, x, cos, sin, q_seg, kv_seg, c, i))
    report("  attention layer decode", *timeit(lambda: block(f(v["params"], x, acache, idx)), args.reps))
    for impl in args.moe_impls:
        moe = SparseMoeBlock(config, impl=impl)
        v = moe.init(key, x)
        f = jax.jit(lambda p, x: moe.apply({"params": p}, x))
        report(f"  MoE block decode ({impl})", *timeit(lambda: block(f(v["params"], x)), args.reps))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--paths", default="train,generate,layers,prefill-layers,decode-layers")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=1536)
    p.add_argument("--gen-rows", type=int, default=16)
    p.add_argument("--prompt", type=int, default=1400)
    p.add_argument("--new", type=int, default=96)
    p.add_argument("--moe-impl", default="blocked")
    p.add_argument("--moe-impls", default="", help="MoE impls for the layer table (default: --moe-impl)")
    p.add_argument("--chunk-sizes", default="64", help="GDN kernel chunk sizes for the layer table")
    p.add_argument("--remat", action="store_true")
    p.add_argument("--vocab", type=int, default=4096)
    args = p.parse_args()
    args.moe_impls = [s for s in (args.moe_impls or args.moe_impl).split(",") if s]
    args.chunk_sizes = [int(s) for s in args.chunk_sizes.split(",") if s]

    from hat_jax.model.config import get_config
    from hat_jax.model.params import init_params

    config = get_config("tiny", vocab_size=args.vocab)
    params = init_params(config, jax.random.key(0))
    print(f"jax {jax.__version__}  devices {jax.devices()}  cores {len(os.sched_getaffinity(0))}  "
          f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}  loadavg {loadavg()}", flush=True)
    paths = args.paths.split(",")
    if "train" in paths:
        bench_train(config, jax.tree_util.tree_map(jnp.copy, params), args)
    if "generate" in paths:
        bench_generate(config, params, args)
    if "layers" in paths:
        bench_layer_table(config, params, args, args.batch, args.seq, backward=True)
    if "prefill-layers" in paths:
        bench_layer_table(config, params, args, args.gen_rows, args.prompt, backward=False)
    if "decode-layers" in paths:
        bench_decode_step(config, params, args)
    print(f"loadavg at end {loadavg()}", flush=True)


if __name__ == "__main__":
    main()
