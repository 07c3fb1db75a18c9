"""hat-jax vs transformers: training-step and cached-decode throughput, memory, MoE dispatch, and the
35B-A3B parameter/optimizer memory budget. A script that prints figures (not a test).

    .venv/bin/python experiments/benchmarks/model_bench.py [--preset tiny] [--batch 8] [--seq 256]
        [--steps 5] [--decode-tokens 64] [--skip-torch] [--json OUT]

What is measured, and how
-------------------------
Each framework runs in its own child process (this file with `--worker jax|torch`), one after the other, so
neither's threads or memory pollute the other's figures; the parent prints the table. Same model config on
both sides: `get_config(preset)` for hat-jax and `transformers.Qwen3_5MoeTextConfig(**config.to_hf_dict())`
-> `Qwen3_5MoeForCausalLM` for transformers (fp32, CPU, random init, different random weights). The JAX
side trains the main model only (the MTP block is left out of the optimised tree, since transformers has
no MTP); the parameter counts of both are printed as a check that the models have the same size.

- Threads: torch gets `torch.set_num_threads(N)` with N the cores this process may use
  (`os.sched_getaffinity`). XLA:CPU sizes its intra-op pool to the same N by itself (no knob).
- Training step: forward + backward + AdamW update (lr 1e-4, betas (0.9, 0.999), eps 1e-8, weight decay
  0.01 on both sides), next-token cross-entropy over all B*(T-1) positions, no aux loss (transformers adds
  none with `output_router_logits=False`). JAX: `optax.adamw`, one `jax.jit` with `donate_argnums` on
  params and optimizer state. torch: `torch.optim.AdamW`, eager. `--warmup` untimed steps (JAX: the first
  one includes compilation, reported separately), then the median wall time of `--steps` steps, each
  ended by `block_until_ready` / the torch call returning. tokens/s = B*T / median step time.
  Two JAX variants: "logits" takes `model.apply(...).logits` [B, T, V] as is; "hidden" asks for
  `return_logits=False` and applies the lm_head kernel to the hidden states reshaped to 2-D (the same
  maths; see the profile for why it is faster on XLA:CPU).
- MoE dispatch: the "logits" training step again with `moe_impl="ragged_dot"` instead of "blocked".
- Cached decode, batch 1 and 8 (`--decode-batches`): a `--prompt-len` random prompt (no padding), one
  prefill call (which yields the first greedy token), then N = `--decode-tokens` single-token greedy
  steps. tokens/s = B * N / (time of the N steps); the prefill is excluded and reported separately;
  median of `--decode-reps` runs after a warm-up run (the JAX warm-up includes compilation, reported).
  JAX: our own loop of a jitted step (`Qwen3_5MoeForCausalLM.apply(..., cache=cache)`, cache from
  `init_cache`, donated); the tokens stay on the device, dispatch is asynchronous and the clock stops at
  `block_until_ready` on the last token. torch: a manual loop of `model(input_ids=tok,
  past_key_values=pkv, use_cache=True)` under `torch.inference_mode()` (the cache object transformers
  creates itself on the prefill call).
  End to end (prefill + N+1 tokens, tokens/s = B*(N+1) / total): JAX `hat_jax.model.sampler.generate`
  (prefill and a `while_loop` of steps in one jit) when that module exists; torch
  `model.generate(do_sample=False, max_new_tokens=N+1, min_new_tokens=N+1)`. Both are checked to give
  the same tokens as the manual loop of their own framework.
- Memory: `maxrss` = the process's peak resident set (`resource.getrusage`), a high-water mark over the
  process life: it includes the framework itself (its value right after the imports is printed) and,
  for JAX, the compiler. JAX extra figures: `live` = sum of `nbytes` of all live jax arrays after the
  phase (params + optimizer state, or params + cache), and XLA's own plan for the compiled train step
  (`compiled.memory_analysis()`: argument/output/temp bytes; temp = activations and scratch).
  torch has no allocator statistics on CPU, so its only figure is maxrss.
- Profile (`--no-profile` skips it): fwd+bwd of single layers at the training shape, jitted on the JAX
  side and eager on the torch side: MoE block (blocked / ragged_dot), Gated DeltaNet layer, the chunked
  delta-rule kernel alone, gated attention layer, lm_head + cross-entropy (3-D vs 2-D input); plus the
  decode step of single layers. Summing layers x counts approximates a step.
- Big model (`--big-preset`, default qwen3_6_35b_a3b): `jax.eval_shape` only, no allocation.
  `param_counts` (total / active per token / MTP / routed experts) against the counts of the real config.json (ARCH_REF), and the
  bytes per device of params + AdamW state under `--mesh` (default data=1, fsdp=8, expert=8, tensor=1 =
  64 devices) computed from the shardings `logical_to_mesh` gives on a `jax.sharding.AbstractMesh`
  (each leaf's `shard_shape`; replicated leaves count in full on every device). Optimizer state shapes
  come from `jax.eval_shape(optax.adamw(...).init, params)`. Variants: fp32 params + fp32 moments; bf16
  params with optax's defaults (both moments follow the param dtype: bf16); bf16 params with
  `mu_dtype=float32` (nu stays bf16); bf16 params + fp32 master copy + fp32 moments (counted from the
  per-device elements: 14 bytes each). MTP parameters included. Activations, gradients, the decode cache
  and XLA temporaries are NOT included.

Notes
-----
- Each phase of a worker runs under a watchdog (`--phase-timeout`) that dumps all stacks and ends the
  worker instead of hanging; the figures measured so far are kept (a worker rewrites its JSON after every
  phase). Before commit c08cca4 the Gated DeltaNet kernel used `lax.linalg.triangular_solve`, whose
  LAPACK lowering on CPU (jaxlib 0.10.2) could deadlock the XLA intra-op pool when several ran at once.
- The big-model section first maps with `DEFAULT_RULES`; if that raises, it prints the error and retries
  with 'mtp_fc_in' replicated (the table once mapped mtp/fc/kernel to ('fsdp', 'fsdp')).
- Timings are wall-clock on a shared machine: the load average at start and end is printed, and besides
  the medians the best step/run is kept ("best" columns, per-run lists in the JSON). With 2 cores, one
  busy core from another process slows XLA:CPU's 2-thread pool about 1.6x and torch's OpenMP regions up
  to 20x (seen: `generate` at batch 1 at 11.6 s instead of 0.5 s), so compare runs on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARCH_REF = {"total": 34.66e9, "active": 3.45e9, "mtp": 0.85e9, "experts": 32.21e9}  # counted from the released Qwen3.6-35B-A3B config.json


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _maxrss_bytes() -> int:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r if sys.platform == "darwin" else r * 1024


def _median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


class _Results:
    """Figures of one worker, rewritten to disk after every phase (so a crash keeps what was measured)."""

    def __init__(self, path: str):
        self.path, self.data = path, {"phases_done": []}

    def put(self, phase: str, value: Any):
        self.data[phase] = value
        self.data["phases_done"].append(phase)
        with open(self.path, "w") as f:
            json.dump(self.data, f)


class _Watchdog:
    """Dumps all stacks and exits the worker when a phase runs past `timeout` seconds."""

    def __init__(self, timeout: float):
        import faulthandler
        self.faulthandler, self.timeout = faulthandler, timeout

    def __enter__(self):
        self.faulthandler.dump_traceback_later(self.timeout, exit=True)

    def __exit__(self, *exc):
        self.faulthandler.cancel_dump_traceback_later()


def _time_calls(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


# ==================================================================================================
# JAX worker
# ==================================================================================================
def jax_worker(args, res: _Results) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from hat_jax.model import Qwen3_5MoeForCausalLM, get_config, init_cache, init_params, param_counts

    res.put("setup", {"maxrss_after_import": _maxrss_bytes(), "jax": jax.__version__, "cores": _cores(),
                      "devices": str(jax.devices())})
    config = get_config(args.preset)
    rng = np.random.default_rng(0)
    b, t, v = args.batch, args.seq, config.vocab_size
    all_params = init_params(config, jax.random.key(0))
    params = {k: x for k, x in all_params.items() if k != "mtp"}
    del all_params
    n_params = int(sum(x.size for x in jax.tree_util.tree_leaves(params)))
    res.put("model", {"params_trained": n_params, "param_counts": param_counts(config)})
    live_bytes = lambda: int(sum(x.nbytes for x in jax.live_arrays()))
    ids = jnp.asarray(rng.integers(0, v, (b, t)), jnp.int32)

    # ---- training steps ----------------------------------------------------------------------------
    def train(moe_impl: str, loss_from: str):
        model = Qwen3_5MoeForCausalLM(config, moe_impl=moe_impl)
        opt = optax.adamw(1e-4, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01)

        def loss_fn(p, ids):
            if loss_from == "logits":
                logits = model.apply({"params": p}, ids).logits[:, :-1]
            else:
                hidden = model.apply({"params": p}, ids, return_logits=False).hidden[:, :-1]
                h2 = hidden.reshape(-1, hidden.shape[-1])
                logits = (h2 @ p["lm_head"]["kernel"]).reshape(*hidden.shape[:2], -1)
            logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
            return -jnp.mean(jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1))

        def step(p, state, ids):
            loss, grads = jax.value_and_grad(loss_fn)(p, ids)
            updates, state = opt.update(grads, state, p)
            return optax.apply_updates(p, updates), state, loss

        p = jax.tree_util.tree_map(jnp.copy, params)
        state = opt.init(p)
        t0 = time.perf_counter()
        compiled = jax.jit(step, donate_argnums=(0, 1)).lower(p, state, ids).compile()
        compile_s = time.perf_counter() - t0
        mem = compiled.memory_analysis()
        holder = {"p": p, "s": state}

        def one():
            holder["p"], holder["s"], loss = compiled(holder["p"], holder["s"], ids)
            jax.block_until_ready(loss)
            return loss

        warm = _time_calls(one, args.warmup)
        times = _time_calls(one, args.steps)
        loss = float(one())
        state_nbytes = int(sum(x.nbytes for x in jax.tree_util.tree_leaves((holder["p"], holder["s"]))))
        out = {"compile_s": compile_s, "warmup_s": warm, "step_s": times, "median_s": _median(times),
               "tokens_per_s": b * t / _median(times), "final_loss": loss, "live_bytes": live_bytes(),
               "train_state_bytes": state_nbytes,
               "xla_argument_bytes": int(mem.argument_size_in_bytes), "xla_output_bytes": int(mem.output_size_in_bytes),
               "xla_temp_bytes": int(mem.temp_size_in_bytes), "xla_alias_bytes": int(mem.alias_size_in_bytes),
               "maxrss": _maxrss_bytes()}
        holder.clear()  # free the train state before the next phase (the closure `one` holds `holder`)
        return out

    with _Watchdog(args.phase_timeout):
        res.put("train_logits", train("blocked", "logits"))
    with _Watchdog(args.phase_timeout):
        res.put("train_hidden", train("blocked", "hidden"))
    if not args.no_moe_compare:
        with _Watchdog(args.phase_timeout):
            res.put("train_ragged_dot", train("ragged_dot", "logits"))

    # ---- cached decode -----------------------------------------------------------------------------
    model = Qwen3_5MoeForCausalLM(config)

    def prefill(p, prompt, cache):
        out = model.apply({"params": p}, prompt, cache=cache, return_logits=False)
        logits = model.apply({"params": p}, out.hidden[:, -1], method=lambda m, h: m.lm_head(h))
        return jnp.argmax(logits, axis=-1).astype(jnp.int32), out.cache

    def step(p, tok, cache):
        out = model.apply({"params": p}, tok[:, None], cache=cache)
        return jnp.argmax(out.logits[:, -1], axis=-1).astype(jnp.int32), out.cache

    prefill_j = jax.jit(prefill, donate_argnums=(2,))
    step_j = jax.jit(step, donate_argnums=(2,))
    try:
        from hat_jax.model import sampler
    except Exception as e:  # noqa: BLE001 - the module is optional
        sampler, sampler_err = None, f"{type(e).__name__}: {e}"
    decode = {}
    n = args.decode_tokens
    for db in args.decode_batches:
        with _Watchdog(args.phase_timeout):
            prompt = jnp.asarray(rng.integers(3, v, (db, args.prompt_len)), jnp.int32)

            def run():
                cache = init_cache(config, db, args.prompt_len + n + 1)
                t0 = time.perf_counter()
                tok, cache = prefill_j(params, prompt, cache)
                jax.block_until_ready(tok)
                t1 = time.perf_counter()
                toks = [tok]
                for _ in range(n):
                    tok, cache = step_j(params, tok, cache)
                    toks.append(tok)
                jax.block_until_ready(tok)
                t2 = time.perf_counter()
                return t1 - t0, t2 - t1, np.stack([np.asarray(x) for x in toks], 1), cache

            t0 = time.perf_counter()
            _, _, _, cache = run()
            first_s = time.perf_counter() - t0
            cache_bytes = int(sum(x.nbytes for x in jax.tree_util.tree_leaves(cache)))
            del cache
            runs = [run() for _ in range(args.decode_reps)]
            pre = _median([r[0] for r in runs])
            dec = _median([r[1] for r in runs])
            entry = {"first_run_s (compile)": first_s, "prefill_s": pre, "decode_s": dec,
                     "decode_runs_s": [r[1] for r in runs], "best_decode_tokens_per_s": db * n / min(r[1] for r in runs),
                     "decode_tokens_per_s": db * n / dec, "ms_per_step": 1e3 * dec / n,
                     "cache_bytes": cache_bytes, "live_bytes": live_bytes(), "maxrss": _maxrss_bytes()}
            loop_tokens = runs[-1][2]
            if sampler is not None:
                sc = sampler.SamplingConfig(max_new_tokens=n + 1, temperature=0.0)
                mask = jnp.ones(prompt.shape, bool)
                gen = lambda: jax.block_until_ready(
                    sampler.generate(params, config, prompt, mask, jax.random.key(0), sc).tokens)
                t0 = time.perf_counter()
                gen_tokens = np.asarray(gen())
                entry["generate_first_s (compile)"] = time.perf_counter() - t0
                gts = _time_calls(gen, args.decode_reps)
                gt = _median(gts)
                entry["generate_s"], entry["generate_runs_s"] = gt, gts
                entry["generate_tokens_per_s"] = db * (n + 1) / gt
                entry["generate_matches_loop"] = bool((gen_tokens == loop_tokens).all())
            else:
                entry["generate"] = f"hat_jax.model.sampler unavailable ({sampler_err})"
            decode[str(db)] = entry
        res.put("decode", decode)

    # ---- profile -----------------------------------------------------------------------------------
    if not args.no_profile:
        with _Watchdog(args.phase_timeout):
            res.put("profile", _jax_profile(args, config, rng))

    # ---- big model: shapes only --------------------------------------------------------------------
    with _Watchdog(args.phase_timeout):
        res.put("big", _big_model(args))


def _jax_profile(args, config, rng) -> dict:
    import jax
    import jax.numpy as jnp

    from hat_jax.model.attention import GatedAttention
    from hat_jax.model.deltanet import GatedDeltaNet, chunk_gated_delta_rule, l2_normalize
    from hat_jax.model.moe import SparseMoeBlock
    from hat_jax.model.rope import rope_cos_sin

    c = config
    b, t, h = args.batch, args.seq, c.hidden_size
    out = {}

    def bench(name, fn, *xs, n=args.profile_reps):
        f = jax.jit(fn)
        jax.block_until_ready(f(*xs))
        out[name] = 1e3 * _median(_time_calls(lambda: jax.block_until_ready(f(*xs)), n))

    x = jnp.asarray(rng.normal(size=(b, t, h)), jnp.float32)
    cos, sin = rope_cos_sin(jnp.broadcast_to(jnp.arange(t), (b, t)), c.rotary_dim, c.rope_parameters.rope_theta)
    seg = jnp.ones((b, t), jnp.int32)  # one segment per row: the causal mask

    def layer(name, module, *extra):
        p = module.init(jax.random.key(0), x, *extra)

        def loss(p, x):
            y = module.apply(p, x, *extra)
            return jnp.sum((y[0] if isinstance(y, tuple) else y) ** 2)

        bench(f"{name} fwd+bwd", jax.value_and_grad(loss, argnums=(0, 1)), p, x)

    layer("moe[blocked]", SparseMoeBlock(c, impl="blocked"))
    layer("moe[ragged_dot]", SparseMoeBlock(c, impl="ragged_dot"))
    layer("deltanet layer", GatedDeltaNet(c))
    layer("attention layer", GatedAttention(c), cos, sin, seg, seg)
    hv, dk, dv = c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim
    q = l2_normalize(jnp.asarray(rng.normal(size=(b, t, hv, dk)), jnp.float32)) * dk**-0.5
    k = l2_normalize(jnp.asarray(rng.normal(size=(b, t, hv, dk)), jnp.float32))
    vv = jnp.asarray(rng.normal(size=(b, t, hv, dv)), jnp.float32)
    g = -jnp.asarray(rng.uniform(0.01, 1.0, size=(b, t, hv)), jnp.float32)
    beta = jnp.asarray(rng.uniform(size=(b, t, hv)), jnp.float32)
    s0 = jnp.zeros((b, hv, dk, dv), jnp.float32)
    kern = lambda q, k, vv: jnp.sum(chunk_gated_delta_rule(q, k, vv, g, beta, s0)[0] ** 2)
    bench("chunk kernel fwd+bwd", jax.value_and_grad(kern, argnums=(0, 1, 2)), q, k, vv)
    w = jnp.asarray(rng.normal(size=(h, c.vocab_size)) * 0.02, jnp.float32)
    ids = jnp.asarray(rng.integers(0, c.vocab_size, (b, t)), jnp.int32)

    def ce3(w, x):
        logp = jax.nn.log_softmax(x @ w, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, ids[..., None], axis=-1))

    def ce2(w, x):
        logp = jax.nn.log_softmax(x.reshape(-1, h) @ w, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, ids.reshape(-1, 1), axis=-1))

    bench("lm_head+CE fwd+bwd (3-D x @ W)", jax.value_and_grad(ce3, argnums=(0, 1)), w, x)
    bench("lm_head+CE fwd+bwd (2-D x @ W)", jax.value_and_grad(ce2, argnums=(0, 1)), w, x)
    for name, f_in, f_out in (("linear 128->512", h, 4 * h),):
        wl = jnp.asarray(rng.normal(size=(f_in, f_out)) * 0.02, jnp.float32)
        bench(f"{name} fwd+bwd (3-D)", jax.value_and_grad(lambda w, x: jnp.sum(jnp.tanh(x @ w)), argnums=(0, 1)), wl, x)
        bench(f"{name} fwd+bwd (2-D)", jax.value_and_grad(
            lambda w, x: jnp.sum(jnp.tanh(x.reshape(-1, f_in) @ w)), argnums=(0, 1)), wl, x)
    # decode step of single layers, batch 1, one token with a cache
    x1 = x[:1, :1]
    cache_len = args.prompt_len + args.decode_tokens + 1
    cos1, sin1 = cos[:1, :1], sin[:1, :1]
    gdn = GatedDeltaNet(c)
    pg = gdn.init(jax.random.key(0), x1)
    gcache = {"conv": jnp.zeros((1, c.linear_conv_kernel_dim - 1, c.linear_conv_dim)),
              "state": jnp.zeros((1, hv, dk, dv))}
    bench("decode: deltanet layer (B=1)", lambda p, x, cc: gdn.apply(p, x, None, cc), pg, x1, gcache, n=50)
    att = GatedAttention(c)
    q_seg1, kv_seg1 = jnp.ones((1, 1), jnp.int32), jnp.ones((1, cache_len), jnp.int32)
    pa = att.init(jax.random.key(0), x1, cos1, sin1, q_seg1, q_seg1)
    acache = {"k": jnp.zeros((1, cache_len, c.num_key_value_heads, c.head_dim)),
              "v": jnp.zeros((1, cache_len, c.num_key_value_heads, c.head_dim))}
    bench("decode: attention layer (B=1)", lambda p, x, cc: att.apply(p, x, cos1, sin1, q_seg1, kv_seg1, cc, jnp.int32(5)),
          pa, x1, acache, n=50)
    moe = SparseMoeBlock(c)
    pm = moe.init(jax.random.key(0), x1)
    bench("decode: moe block (B=1)", lambda p, x: moe.apply(p, x), pm, x1, n=50)
    wl = jnp.asarray(rng.normal(size=(h, c.vocab_size)) * 0.02, jnp.float32)
    bench("decode: lm_head (B=1)", lambda w, x: x @ w, wl, x1, n=50)
    bench("decode: empty jit call", lambda x: x + 1, x1, n=50)
    return out


def _big_model(args) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from jax.sharding import AbstractMesh

    from hat_jax.model import get_config, param_counts, params_logical_axes, params_shapes
    from hat_jax.model.sharding import DEFAULT_RULES, MESH_AXES, logical_to_mesh

    config = get_config(args.big_preset)
    t0 = time.perf_counter()
    counts = param_counts(config)
    shapes32 = params_shapes(config, jnp.float32)
    axes = params_logical_axes(config)
    eval_s = time.perf_counter() - t0
    shape = tuple(args.mesh) + (1,) * (len(MESH_AXES) - len(args.mesh))  # context defaults to 1
    sizes = dict(zip(MESH_AXES, shape))
    mesh = AbstractMesh(shape, MESH_AXES)
    out = {"preset": args.big_preset, "counts": counts, "arch_md": ARCH_REF, "eval_shape_s": eval_s,
           "mesh": sizes, "devices": math.prod(args.mesh)}
    rules = DEFAULT_RULES
    try:
        shardings = logical_to_mesh(axes, shapes32, mesh)
        out["default_rules"] = "ok"
    except Exception as e:  # noqa: BLE001 - reported
        out["default_rules"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        rules = tuple((k, None if k == "mtp_fc_in" else m) for k, m in DEFAULT_RULES)
        shardings = logical_to_mesh(axes, shapes32, mesh, rules)
        out["rules_used"] = "DEFAULT_RULES with mtp_fc_in -> None (replicated)"

    flat_sh = jax.tree_util.tree_leaves(shardings)
    flat_shapes = jax.tree_util.tree_flatten_with_path(shapes32)[0]

    def per_device_elems(which):
        tot = 0
        for (path, leaf), sh in zip(flat_shapes, flat_sh):
            if which(jax.tree_util.keystr(path)):
                tot += int(np.prod(sh.shard_shape(leaf.shape)))
        return tot

    main_el = per_device_elems(lambda p: not p.startswith("['mtp']"))
    mtp_el = per_device_elems(lambda p: p.startswith("['mtp']"))
    repl_el = sum(int(np.prod(leaf.shape)) for (_, leaf), sh in zip(flat_shapes, flat_sh)
                  if sh.shard_shape(leaf.shape) == leaf.shape)
    out["per_device_param_elems"] = {"main": main_el, "mtp": mtp_el, "fully_replicated_leaves": repl_el}

    def state_bytes(param_dtype, mu_dtype=None):
        shapes = jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct(s.shape, param_dtype), shapes32)
        opt_shapes = jax.eval_shape(optax.adamw(1e-4, mu_dtype=mu_dtype).init, shapes)
        adam = opt_shapes[0]  # ScaleByAdamState(count, mu, nu)
        total = 0
        for tree in (shapes, adam.mu, adam.nu):
            for leaf, sh in zip(jax.tree_util.tree_leaves(tree), flat_sh):
                total += int(np.prod(sh.shard_shape(leaf.shape))) * jnp.dtype(leaf.dtype).itemsize
        total += sum(int(np.prod(x.shape)) * jnp.dtype(x.dtype).itemsize
                     for x in jax.tree_util.tree_leaves(opt_shapes) if x.ndim == 0)
        return total

    el = main_el + mtp_el
    out["bytes_per_device"] = {
        "fp32 params + fp32 mu/nu (optax.adamw)": state_bytes(jnp.float32),
        "bf16 params + optax defaults (mu/nu bf16)": state_bytes(jnp.bfloat16),
        "bf16 params + mu_dtype=fp32 (nu bf16)": state_bytes(jnp.bfloat16, jnp.float32),
        # optax keeps nu in the param dtype and has no master copy; this one is counted from the elements:
        "bf16 params + fp32 master + fp32 mu/nu": (2 + 4 + 4 + 4) * el,
    }
    out["ideal_fp32_bytes_per_device"] = 12 * (counts["total"] + counts["mtp"]) / math.prod(args.mesh)
    return out


# ==================================================================================================
# torch worker
# ==================================================================================================
def torch_worker(args, res: _Results) -> None:
    import torch
    import transformers

    from hat_jax.model import get_config

    threads = _cores()
    torch.set_num_threads(threads)
    res.put("setup", {"maxrss_after_import": _maxrss_bytes(), "torch": torch.__version__,
                      "transformers": transformers.__version__, "threads": torch.get_num_threads()})
    config = get_config(args.preset)
    torch.manual_seed(0)
    model = transformers.Qwen3_5MoeForCausalLM(transformers.Qwen3_5MoeTextConfig(**config.to_hf_dict())).float()
    res.put("model", {"params": int(sum(p.numel() for p in model.parameters())),
                      "attn_implementation": model.config._attn_implementation})
    b, t, v = args.batch, args.seq, config.vocab_size
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, v, (b, t), generator=gen)

    with _Watchdog(args.phase_timeout):
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)

        def one():
            logits = model(input_ids=ids, use_cache=False).logits[:, :-1]
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, v).float(), ids[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        warm = _time_calls(one, args.warmup)
        times = _time_calls(one, args.steps)
        res.put("train", {"warmup_s": warm, "step_s": times, "median_s": _median(times),
                          "tokens_per_s": b * t / _median(times), "final_loss": float(one().detach()),
                          "maxrss": _maxrss_bytes()})
        opt.state.clear()  # free the Adam moments before the next phase
        model.zero_grad(set_to_none=True)

    model.eval()
    n = args.decode_tokens
    decode = {}
    for db in args.decode_batches:
        with _Watchdog(args.phase_timeout), torch.inference_mode():
            prompt = torch.randint(3, v, (db, args.prompt_len), generator=gen)

            def run():
                t0 = time.perf_counter()
                out = model(input_ids=prompt, use_cache=True)
                pkv, tok = out.past_key_values, out.logits[:, -1].argmax(-1)
                t1 = time.perf_counter()
                toks = [tok]
                for _ in range(n):
                    out = model(input_ids=tok[:, None], past_key_values=pkv, use_cache=True)
                    pkv, tok = out.past_key_values, out.logits[:, -1].argmax(-1)
                    toks.append(tok)
                t2 = time.perf_counter()
                return t1 - t0, t2 - t1, torch.stack(toks, 1)

            run()
            runs = [run() for _ in range(args.decode_reps)]
            dec = _median([r[1] for r in runs])
            entry = {"prefill_s": _median([r[0] for r in runs]), "decode_s": dec,
                     "decode_runs_s": [r[1] for r in runs], "best_decode_tokens_per_s": db * n / min(r[1] for r in runs),
                     "decode_tokens_per_s": db * n / dec, "ms_per_step": 1e3 * dec / n}
            mask = torch.ones_like(prompt)
            gen_call = lambda: model.generate(input_ids=prompt, attention_mask=mask, do_sample=False,
                                              max_new_tokens=n + 1, min_new_tokens=n + 1,
                                              pad_token_id=config.pad_token_id)
            gen_call()
            times, outs = [], None
            for _ in range(args.decode_reps):
                t0 = time.perf_counter()
                outs = gen_call()
                times.append(time.perf_counter() - t0)
            entry["generate_s"], entry["generate_runs_s"] = _median(times), times
            entry["generate_tokens_per_s"] = db * (n + 1) / _median(times)
            entry["generate_matches_loop"] = bool((outs[:, args.prompt_len:] == runs[-1][2]).all())
            entry["maxrss"] = _maxrss_bytes()
            decode[str(db)] = entry
        res.put("decode", decode)

    if not args.no_profile:
        with _Watchdog(args.phase_timeout):
            res.put("profile", _torch_profile(args, model, config))


def _torch_profile(args, model, config) -> dict:
    import torch
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as hf

    c = config
    b, t, h = args.batch, args.seq, c.hidden_size
    out = {}
    torch.manual_seed(1)
    model.train()
    lin = next(l for l in model.model.layers if hasattr(l, "linear_attn"))
    att = next(l for l in model.model.layers if hasattr(l, "self_attn"))

    def bench(name, fn, n=args.profile_reps):
        fn()
        out[name] = 1e3 * _median(_time_calls(fn, n))

    x = torch.randn(b, t, h, requires_grad=True)
    pos = model.model.rotary_emb(x, torch.arange(t)[None].expand(b, t))

    def fb(f):
        def g():
            y = f()
            (y[0] if isinstance(y, tuple) else y).pow(2).sum().backward()
        return g

    bench("moe[blocked] fwd+bwd", fb(lambda: lin.mlp(x)))  # HF: loop over hit experts
    bench("deltanet layer fwd+bwd", fb(lambda: lin.linear_attn(x)))
    bench("attention layer fwd+bwd", fb(lambda: att.self_attn(x, position_embeddings=pos, attention_mask=None)))
    hv, dk, dv = c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim
    q = torch.nn.functional.normalize(torch.randn(b, t, hv, dk), dim=-1).requires_grad_()
    k = torch.nn.functional.normalize(torch.randn(b, t, hv, dk), dim=-1).requires_grad_()
    vv = torch.randn(b, t, hv, dv, requires_grad=True)
    g = -torch.rand(b, t, hv) * 0.99 - 0.01
    beta = torch.rand(b, t, hv)
    bench("chunk kernel fwd+bwd", lambda: hf.torch_chunk_gated_delta_rule(
        q, k, vv, g, beta, chunk_size=64, initial_state=None, output_final_state=False)[0].pow(2).sum().backward())
    w = torch.nn.Linear(h, c.vocab_size, bias=False)
    ids = torch.randint(0, c.vocab_size, (b, t))
    bench("lm_head+CE fwd+bwd (3-D x @ W)", lambda: torch.nn.functional.cross_entropy(
        w(x).reshape(-1, c.vocab_size), ids.reshape(-1)).backward())
    model.eval()
    with torch.inference_mode():
        cache_len = args.prompt_len + args.decode_tokens + 1
        prompt = torch.randint(3, c.vocab_size, (1, cache_len - 1))
        pkv = model(input_ids=prompt, use_cache=True).past_key_values
        x1 = torch.randn(1, 1, h)
        pos1 = model.model.rotary_emb(x1, torch.tensor([[cache_len - 1]]))

        def gdn_step():
            lin.linear_attn(x1, cache_params=pkv)

        bench("decode: deltanet layer (B=1)", gdn_step, n=50)
        bench("decode: moe block (B=1)", lambda: lin.mlp(x1), n=50)
        bench("decode: lm_head (B=1)", lambda: model.lm_head(x1), n=50)
        # with the cache: every call appends one slot to this layer's KV (97 -> ~150 slots over the calls)
        bench("decode: attention layer (B=1)", lambda: att.self_attn(
            x1, position_embeddings=pos1, attention_mask=None, past_key_values=pkv), n=50)
    return out


# ==================================================================================================
# parent: run workers, print
# ==================================================================================================
def _fmt_bytes(n) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024


def _run_worker(kind: str, argv: list[str], timeout: float) -> tuple[dict, str]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    cmd = [sys.executable, os.path.abspath(__file__), *argv, "--worker", kind, "--worker-out", path]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    note = f"{kind} worker: rc={proc.returncode}, {time.perf_counter() - t0:.0f} s"
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError):
        data = {}
    os.unlink(path)
    if proc.returncode:
        note += "\n" + "\n".join(proc.stderr.strip().splitlines()[-40:])
    return data, note


def _row(cols, widths):
    return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cols, widths)))


def report(args, jx: dict, th: dict, notes: list[str]) -> None:
    p = print
    fmt = lambda x, spec=".0f": "-" if x is None else format(x, spec)
    ratio = lambda a, b_: None if (a is None or not b_) else a / b_
    g = lambda d, *ks: _get(d, *ks)
    p("=" * 100)
    p(f"hat-jax vs transformers on preset '{args.preset}' (fp32, CPU)")
    setup_j, setup_t = jx.get("setup", {}), th.get("setup", {})
    torch_desc = (f"torch {setup_t.get('torch', '-')} threads={setup_t.get('threads', '-')} (torch.set_num_threads), "
                  f"transformers {setup_t.get('transformers', '-')}, attn={g(th, 'model', 'attn_implementation') or '-'}"
                  if th else "torch skipped")
    p(f"cores: {_cores()} | JAX {setup_j.get('jax', '?')} (XLA:CPU intra-op pool = all {_cores()} cores, "
      f"no knob) | {torch_desc}")
    p(f"load average at start: {args._load0} | params trained: JAX {g(jx, 'model', 'params_trained')} "
      f"(main model, MTP excluded) vs torch {g(th, 'model', 'params')}")
    p("")
    p(f"TRAINING STEP  batch {args.batch} x seq {args.seq}, AdamW, median of {args.steps} steps after {args.warmup} warm-up")
    w = (46, 9, 9, 9, 9, 10, 8)
    p(_row(["", "ms/step", "best ms", "tokens/s", "vs torch", "best vs", "compile"], w))
    tt = g(th, "train", "tokens_per_s")
    best = lambda d: min(d["step_s"]) if d and d.get("step_s") else None
    bt = best(th.get("train"))
    p(_row(["transformers (eager)", fmt(g(th, "train", "median_s") and 1e3 * g(th, "train", "median_s")),
            fmt(bt and 1e3 * bt), fmt(tt), "1.00x" if tt else "-", "1.00x" if tt else "-", "-"], w))
    for key, label in (("train_logits", "hat-jax blocked, loss on model logits"),
                       ("train_hidden", "hat-jax blocked, loss on hidden @ lm_head (2-D)"),
                       ("train_ragged_dot", "hat-jax ragged_dot, loss on model logits")):
        d = jx.get(key)
        if d:
            r = ratio(d["tokens_per_s"], tt)
            rb = ratio(bt, best(d))
            p(_row([label, fmt(1e3 * d["median_s"]), fmt(1e3 * best(d)), fmt(d["tokens_per_s"]),
                    f"{r:.2f}x" if r else "-", f"{rb:.2f}x" if rb else "-", f"{d['compile_s']:.1f}s"], w))
    d = jx.get("train_logits")
    if d and jx.get("train_ragged_dot"):
        rb = ratio(d["tokens_per_s"], g(jx, "train_ragged_dot", "tokens_per_s"))
        p(f"MoE dispatch: blocked / ragged_dot = {fmt(rb, '.2f')}x (train step tokens/s)")
    p("")
    p(f"CACHED DECODE  prompt {args.prompt_len}, greedy, {args.decode_tokens} single-token steps timed "
      f"(prefill excluded); end-to-end = prefill + {args.decode_tokens + 1} tokens")
    w = (40, 11, 11, 12, 11, 12, 11)
    p(_row(["", "tokens/s", "ms/step", "vs torch", "prefill ms", "e2e tok/s", "e2e vs"], w))
    for db in args.decode_batches:
        dj, dt = g(jx, "decode", str(db)) or {}, g(th, "decode", str(db)) or {}
        p(_row([f"B={db} transformers (manual loop | generate)", fmt(dt.get("decode_tokens_per_s")),
                fmt(dt.get("ms_per_step"), ".2f"), "1.00x" if dt else "-", fmt(dt.get("prefill_s") and 1e3 * dt["prefill_s"], ".1f"),
                fmt(dt.get("generate_tokens_per_s")), "1.00x" if dt else "-"], w))
        r = ratio(dj.get("decode_tokens_per_s"), dt.get("decode_tokens_per_s"))
        r2 = ratio(dj.get("generate_tokens_per_s"), dt.get("generate_tokens_per_s"))
        p(_row([f"B={db} hat-jax (jit step loop | sampler.generate)", fmt(dj.get("decode_tokens_per_s")),
                fmt(dj.get("ms_per_step"), ".2f"), f"{r:.2f}x" if r else "-",
                fmt(dj.get("prefill_s") and 1e3 * dj["prefill_s"], ".1f"), fmt(dj.get("generate_tokens_per_s")),
                f"{r2:.2f}x" if r2 else "-"], w))
        checks = [f"JAX loop == sampler.generate: {dj.get('generate_matches_loop', dj.get('generate'))}",
                  f"torch loop == generate: {dt.get('generate_matches_loop', '-')}",
                  f"JAX compile: step loop {fmt(dj.get('first_run_s (compile)'), '.1f')} s, "
                  f"generate {fmt(dj.get('generate_first_s (compile)'), '.1f')} s"]
        p("    " + " | ".join(checks))
    p("")
    p("MEMORY  (maxrss = process peak RSS so far, includes the framework; 'after import' is the baseline)")
    p(f"  JAX  : after import {_fmt_bytes(g(jx, 'setup', 'maxrss_after_import'))}, after train "
      f"{_fmt_bytes(g(jx, 'train_logits', 'maxrss'))}, after all phases {_fmt_bytes(_max_rss(jx))}")
    d = jx.get("train_logits") or {}
    p(f"         train step: all live jax arrays {_fmt_bytes(d.get('live_bytes'))} (incl. the initial params kept "
      "for later phases), "
      f"of which params+AdamW state {_fmt_bytes(d.get('train_state_bytes'))}; "
      f"XLA plan: args {_fmt_bytes(d.get('xla_argument_bytes'))}, outputs {_fmt_bytes(d.get('xla_output_bytes'))} "
      f"(aliased/donated {_fmt_bytes(d.get('xla_alias_bytes'))}), temps {_fmt_bytes(d.get('xla_temp_bytes'))}")
    for db in args.decode_batches:
        dj = g(jx, "decode", str(db)) or {}
        p(f"         decode B={db}: cache {_fmt_bytes(dj.get('cache_bytes'))}, live jax arrays {_fmt_bytes(dj.get('live_bytes'))}")
    p(f"  torch: after import {_fmt_bytes(g(th, 'setup', 'maxrss_after_import'))}, after train "
      f"{_fmt_bytes(g(th, 'train', 'maxrss'))}, after all phases {_fmt_bytes(_max_rss(th))}")
    if jx.get("profile") or th.get("profile"):
        p("")
        p(f"PROFILE  single layers at batch {args.batch} x seq {args.seq} (ms, median); JAX jitted, torch eager")
        pj, pt = jx.get("profile", {}), th.get("profile", {})
        keys = list(dict.fromkeys(list(pj) + [k for k in pt if k not in pj]))
        w = (44, 10, 10, 10)
        p(_row(["", "hat-jax", "torch", "jax/torch"], w))
        for k in keys:
            tk = pt.get(k)
            r = ratio(pj.get(k), tk)
            p(_row([k, fmt(pj.get(k), ".2f"), fmt(tk, ".2f"), f"{r:.2f}" if r else "-"], w))
        c = _layer_counts(args.preset)
        if pj:
            est = (c["linear"] * pj.get("deltanet layer fwd+bwd", 0) + c["full"] * pj.get("attention layer fwd+bwd", 0)
                   + c["layers"] * pj.get("moe[blocked] fwd+bwd", 0) + pj.get("lm_head+CE fwd+bwd (3-D x @ W)", 0))
            p(f"  JAX sum of layers ({c['linear']} deltanet + {c['full']} attention + {c['layers']} moe + lm_head/CE): "
              f"{est:.0f} ms vs measured step {fmt(d.get('median_s') and 1e3 * d['median_s'])} ms")
        if pt:
            est = (c["linear"] * pt.get("deltanet layer fwd+bwd", 0) + c["full"] * pt.get("attention layer fwd+bwd", 0)
                   + c["layers"] * pt.get("moe[blocked] fwd+bwd", 0) + pt.get("lm_head+CE fwd+bwd (3-D x @ W)", 0))
            p(f"  torch sum of layers: {est:.0f} ms vs measured step {fmt(g(th, 'train', 'median_s') and 1e3 * g(th, 'train', 'median_s'))} ms")
        p("  (torch 'moe[blocked]' row = the HF MoE block, a loop over the experts hit)")
    big = jx.get("big")
    if big:
        p("")
        cnt = big["counts"]
        p(f"BIG MODEL '{big['preset']}' via jax.eval_shape ({big['eval_shape_s']:.1f} s, nothing allocated)")
        for k, label in (("total", "total (text model, no MTP)"), ("active", "active per token"),
                         ("experts", "routed experts"), ("mtp", "MTP block")):
            ref = ARCH_REF[k]
            p(f"  {label:28s} {cnt[k] / 1e9:8.3f} B   reference: {ref / 1e9:.2f} B   ({100 * (cnt[k] / ref - 1):+.2f}%)")
        p(f"  mesh {big['mesh']} = {big['devices']} devices (AbstractMesh); DEFAULT_RULES: {big['default_rules']}")
        if "rules_used" in big:
            p(f"  -> used {big['rules_used']}")
        el = big["per_device_param_elems"]
        p(f"  per-device parameter elements: main {el['main'] / 1e6:.1f} M + MTP {el['mtp'] / 1e6:.1f} M "
          f"(fully replicated leaves: {el['fully_replicated_leaves'] / 1e6:.2f} M elements)")
        for k, nbytes in big["bytes_per_device"].items():
            p(f"  params + AdamW state, {k:44s} {_fmt_bytes(nbytes):>10s} per device")
        p(f"  (ideal with every leaf split {big['devices']} ways, fp32 + fp32 mu/nu: "
          f"{_fmt_bytes(big['ideal_fp32_bytes_per_device'])}; activations, gradients, the decode cache and "
          "XLA temporaries not included)")
    p("")
    p("TARGETS" + ("  (n/a: --skip-torch)" if not th else ""))
    tj = g(jx, "train_logits", "tokens_per_s")
    th_ = g(jx, "train_hidden", "tokens_per_s")
    bt = best(th.get("train"))
    for label, val, key in (("train step (loss on logits)  >= 2x", ratio(tj, tt), "train_logits"),
                            ("train step (loss on hidden)  >= 2x", ratio(th_, tt), "train_hidden")):
        vb = ratio(bt, best(jx.get(key)))
        p(f"  {label}: {fmt(val, '.2f')}x (best-of-steps {fmt(vb, '.2f')}x) -> "
          f"{'MET' if val and val >= 2 else 'NOT MET'}")
    for db in args.decode_batches:
        r = ratio(g(jx, "decode", str(db), "decode_tokens_per_s"), g(th, "decode", str(db), "decode_tokens_per_s"))
        rb = ratio(g(jx, "decode", str(db), "best_decode_tokens_per_s"),
                   g(th, "decode", str(db), "best_decode_tokens_per_s"))
        p(f"  cached decode B={db}          >= 3x: {fmt(r, '.2f')}x (best-of-runs {fmt(rb, '.2f')}x) -> "
          f"{'MET' if r and r >= 3 else 'NOT MET'}")
    for n in notes:
        p("note: " + n)


def _get(d, *keys):
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def _max_rss(d: dict):
    vals = []

    def walk(x):
        if isinstance(x, dict):
            for k, v in x.items():
                if k == "maxrss" and isinstance(v, int):
                    vals.append(v)
                else:
                    walk(v)

    walk(d)
    return max(vals) if vals else None


def _layer_counts(preset: str) -> dict:
    from hat_jax.model.config import FULL_ATTENTION, get_config
    c = get_config(preset)
    full = sum(t == FULL_ATTENTION for t in c.layer_types)
    return {"layers": c.num_hidden_layers, "full": full, "linear": c.num_hidden_layers - full}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=5, help="timed training steps (median)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed training steps first")
    ap.add_argument("--decode-tokens", type=int, default=64, help="timed single-token decode steps")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--decode-batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8])
    ap.add_argument("--decode-reps", type=int, default=3, help="timed decode runs (median)")
    ap.add_argument("--profile-reps", type=int, default=5)
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--no-moe-compare", action="store_true")
    ap.add_argument("--big-preset", default="qwen3_6_35b_a3b")
    ap.add_argument("--mesh", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 8, 1],
                    help="data,fsdp,expert,tensor sizes for the big-model memory estimate")
    ap.add_argument("--phase-timeout", type=float, default=420.0, help="watchdog seconds per phase")
    ap.add_argument("--json", metavar="OUT", help="also write all figures as JSON")
    ap.add_argument("--worker", choices=("jax", "torch"), help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        res = _Results(args.worker_out)
        (jax_worker if args.worker == "jax" else torch_worker)(args, res)
        return
    t0 = time.perf_counter()
    args._load0 = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    passthrough = [a for a in (argv if argv is not None else sys.argv[1:])]
    if "--json" in passthrough:
        i = passthrough.index("--json")
        del passthrough[i:i + 2]
    notes = []
    jx, note = _run_worker("jax", passthrough, timeout=1800)
    notes.append(note)
    th = {}
    if not args.skip_torch:
        th, note = _run_worker("torch", passthrough, timeout=1800)
        notes.append(note)
    notes.append(f"load average at end: {', '.join(f'{x:.2f}' for x in os.getloadavg())} "
                 "(other processes on the machine skew the timings)")
    notes.append(f"total wall time {time.perf_counter() - t0:.0f} s")
    report(args, jx, th, notes)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items() if not k.startswith("_")},
                       "jax": jx, "torch": th, "notes": notes}, f, indent=1)


if __name__ == "__main__":
    main()
