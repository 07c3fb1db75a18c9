"""The shared loop: token-mean accumulation, the lb coefficient, NaN stop, bf16 compute, sharded steps.

Run as a script (`python test_trainer.py OUT.json`) this file is the 8-device worker of
`test_sharded_steps_match_single_device`: XLA_FLAGS must be set before jax starts, so it runs in a
subprocess that does two train steps of the micro model on one device and on a (2, 1, 2, 2) mesh.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from hat_jax.model import Qwen3_5MoeForCausalLM, get_config, init_params
from hat_jax.train.checkpoints import StageCheckpointer, restore_latest
from hat_jax.train.optim import OptimConfig, lr_schedule, make_optimizer
from hat_jax.train.sft import sft_loss_fn
from hat_jax.train.trainer import (LoopConfig, NonFiniteLossError, accumulate_gradients, finite_flag,
                                   init_train_state, make_train_step, moe_aux, output_router_stats, run_stage,
                                   split_micro_batches)


def toy_loss(params, micro, rng):
    """loss_sum = sum(mask * (w x)^2), n = sum(mask), lb = (w - a)^2; loss and gradient NaN where
    micro['poison'] is set."""
    w = params["w"]
    loss_sum = jnp.sum(micro["mask"] * (w * micro["x"]) ** 2) * jnp.where(jnp.any(micro["poison"] > 0), jnp.nan, 1.0)
    return loss_sum, jnp.sum(micro["mask"]), {"lb_loss": (w - micro["a"][0]) ** 2}


def toy_batch(poison=0.0):
    # micro-batch 1: one loss token (x=1); micro-batch 2: three (x = 1, 1, 2). a = 1 and 0.
    return {"x": jnp.asarray([[[1.0, 5.0, 5.0]], [[1.0, 1.0, 2.0]]]),
            "mask": jnp.asarray([[[1.0, 0.0, 0.0]], [[1.0, 1.0, 1.0]]]),
            "a": jnp.asarray([[1.0], [0.0]]), "poison": jnp.full((2, 1), poison)}


@pytest.mark.parametrize("coef", [0.0, 0.5])
def test_token_mean_and_lb_coefficient_by_hand(coef):
    grads, stats = jax.jit(lambda p, b: accumulate_gradients(toy_loss, p, b, jax.random.key(0), coef))(
        {"w": jnp.asarray(2.0)}, toy_batch())
    # CE: (4 + 24) / 4 tokens = 7 (a mean of per-micro-batch means would give 6); d/dw = 2w * (1 + 6) / 4 = 7.
    # lb: micro-batch losses 1 and 4 weighted by tokens 1 and 3 -> 13/4; d/dw = (1 * 2 + 3 * 4) / 4 = 3.5.
    assert float(stats["loss"]) == pytest.approx(7.0)
    assert float(stats["lb_loss"]) == pytest.approx(3.25)
    assert float(stats["loss_tokens"]) == 4.0
    assert float(stats["total_loss"]) == pytest.approx(7.0 + coef * 3.25)
    assert float(grads["w"]) == pytest.approx(7.0 + coef * 3.5)


def test_accumulated_gradient_equals_full_batch_micro_model():
    config = get_config("micro")
    params = init_params(config, jax.random.key(0))
    loss_fn = sft_loss_fn(Qwen3_5MoeForCausalLM(config))
    rng = np.random.default_rng(0)
    b, t = 4, 24
    batch = {"input_ids": rng.integers(3, config.vocab_size, (b, t)).astype(np.int32),
             "attention_mask": np.ones((b, t), np.int32), "loss_mask": np.zeros((b, t), np.int32)}
    batch["attention_mask"][1, 20:] = 0  # a padded row
    for row, (lo, hi) in enumerate([(2, 23), (5, 8), (10, 24), (1, 3)]):  # unequal loss-token counts
        batch["loss_mask"][row, lo:hi] = 1
    batch["loss_mask"] *= batch["attention_mask"]
    grad_fn = jax.jit(lambda p, bt: accumulate_gradients(loss_fn, p, bt, jax.random.key(1), 0.0))
    full, full_stats = grad_fn(params, split_micro_batches(batch, 1))
    acc, acc_stats = grad_fn(params, split_micro_batches(batch, 2))
    assert float(full_stats["loss_tokens"]) == float(acc_stats["loss_tokens"]) == batch["loss_mask"].sum()
    assert float(acc_stats["loss"]) == pytest.approx(float(full_stats["loss"]), abs=1e-6)
    for (path, g_full), g_acc in zip(jax.tree_util.tree_leaves_with_path(full), jax.tree_util.tree_leaves(acc)):
        np.testing.assert_allclose(g_acc, g_full, atol=1e-6, rtol=0, err_msg=jax.tree_util.keystr(path))
    # moe_aux: the lb loss is hat_jax.model.moe.load_balancing_loss with the attention mask as token mask.
    from hat_jax.model.moe import load_balancing_loss

    @jax.jit
    def lb_both_ways(p, ids, mask):
        out = Qwen3_5MoeForCausalLM(config).apply({"params": p}, ids, attention_mask=mask)
        aux = moe_aux(output_router_stats(out, mask, config.num_experts_per_tok))
        return aux, load_balancing_loss(out.router_logits, 2, mask.reshape(-1))

    aux, direct = lb_both_ways(params, batch["input_ids"], batch["attention_mask"])
    assert float(aux["lb_loss"]) == pytest.approx(float(direct), rel=1e-6)
    assert 0.0 <= float(aux["moe/expert_load_cv"]) < 2.0


def test_train_step_donates_and_reports(tmp_path):
    optim = OptimConfig(lr=0.1, warmup_steps=2, total_steps=10, clip_norm=None)
    tx = make_optimizer(optim)
    step_fn = make_train_step(toy_loss, tx, lb_coef=0.5, schedule=lr_schedule(optim))
    state = init_train_state({"w": jnp.asarray(2.0)}, tx, jax.random.key(0))
    old_w = state.params["w"]
    state, metrics = step_fn(state, toy_batch())
    assert old_w.is_deleted()  # the input state's buffers were donated
    assert int(state.step) == 1 and float(metrics["lr"]) == 0.0  # warmup starts at 0
    assert float(metrics["grad_norm"]) == pytest.approx(8.75)
    state, metrics = step_fn(state, toy_batch())
    assert float(metrics["lr"]) == pytest.approx(0.05)


def test_a_tied_lm_head_trains_as_the_embeddings_transpose():
    # loss_sum = sum(E) + sum(W^2), W the lm_head [H, V] and E the embedding [V, H]. Tied, W = E^T, so the
    # embedding's gradient is 1 + 2E (both uses) and the lm_head's is 0; after an SGD step W is the new E^T.
    def loss(params, micro, rng):
        e, w = params["model"]["embed_tokens"]["embedding"], params["lm_head"]["kernel"]
        return jnp.sum(e) + jnp.sum(w ** 2), jnp.asarray(1.0), {}

    e = jnp.asarray([[1.0, -2.0], [0.5, 3.0], [0.0, 1.0]])
    params = {"model": {"embed_tokens": {"embedding": e}}, "lm_head": {"kernel": jnp.zeros((2, 3))}}
    tx = optax.sgd(0.1)
    step_fn = make_train_step(loss, tx, tie_lm_head=True, donate=False)
    state, metrics = step_fn(init_train_state(params, tx, jax.random.key(0)), {"x": jnp.zeros((1, 1))})
    want = e - 0.1 * (1.0 + 2.0 * e)
    np.testing.assert_allclose(state.params["model"]["embed_tokens"]["embedding"], want, rtol=1e-6)
    np.testing.assert_array_equal(state.params["lm_head"]["kernel"], state.params["model"]["embed_tokens"]["embedding"].T)
    assert float(metrics["loss"]) == pytest.approx(float(jnp.sum(e) + jnp.sum(e ** 2)))
    assert float(metrics["grad_norm"]) == pytest.approx(float(jnp.linalg.norm(1.0 + 2.0 * e)), rel=1e-6)
    # untied, the same step moves each by its own gradient
    untied, _ = make_train_step(loss, tx, donate=False)(init_train_state(params, tx, jax.random.key(0)),
                                                        {"x": jnp.zeros((1, 1))})
    np.testing.assert_allclose(untied.params["model"]["embed_tokens"]["embedding"], e - 0.1, rtol=1e-6)
    np.testing.assert_array_equal(untied.params["lm_head"]["kernel"], jnp.zeros((2, 3)))


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
    tx = make_optimizer(OptimConfig(lr=0.1, warmup_steps=0, total_steps=10))
    step_fn = make_train_step(toy_loss, tx)
    state = init_train_state({"w": jnp.asarray(2.0)}, tx, jax.random.key(0))
    seen, good = [], {}

    def batches():
        for step in range(1, 11):
            seen.append(step)
            yield toy_batch(poison=1.0 if step == 5 else 0.0)

    def recording_step(s, b):
        s, m = step_fn(s, b)
        good[int(s.step)] = float(s.params["w"])
        return s, m

    checkpointer = StageCheckpointer(tmp_path, {"stage": "toy"}, async_save=False)
    loop = LoopConfig(steps=10, log_every=1, ckpt_every=2, progress=False)
    with pytest.raises(NonFiniteLossError, match=r"non-finite loss at step 5 .*stopped without saving step 5, the "
                                                 r"last checkpoint that passed this check is step 4") as err:
        run_stage(loop, state, batches(), recording_step, checkpointer=checkpointer,
                  data_state=lambda: {"consumed": len(seen)})
    assert err.value.step == 5 and err.value.last_checkpoint == 4 and not np.isfinite(good[5])
    checkpointer.close()
    assert sorted(int(p.name) for p in tmp_path.iterdir() if p.name.isdigit()) == [2, 4]
    abstract = jax.eval_shape(lambda: init_train_state({"w": jnp.asarray(0.0)}, tx, jax.random.key(0)))
    restored, data_state, _ = restore_latest(tmp_path, abstract)
    assert int(restored.step) == 4 and float(restored.params["w"]) == good[4] and np.isfinite(good[4])
    assert data_state == {"consumed": 4}


def test_bf16_compute_keeps_fp32_grads():
    config = get_config("micro")
    params = init_params(config, jax.random.key(0))
    ids = np.random.default_rng(1).integers(3, config.vocab_size, (1, 2, 16)).astype(np.int32)
    batch = {"input_ids": ids, "attention_mask": np.ones_like(ids), "loss_mask": np.ones_like(ids)}
    batch["loss_mask"][..., 0] = 0
    out = {}
    for name, dtype in (("fp32", jnp.float32), ("bf16", jnp.bfloat16)):
        loss_fn = sft_loss_fn(Qwen3_5MoeForCausalLM(config, dtype=dtype))
        out[name] = jax.jit(lambda p, b: accumulate_gradients(loss_fn, p, b, jax.random.key(0)))(params, batch)
    assert all(g.dtype == jnp.float32 for g in jax.tree_util.tree_leaves(out["bf16"][0]))
    assert float(out["bf16"][1]["loss"]) == pytest.approx(float(out["fp32"][1]["loss"]), rel=2e-2)


# ------------------------------------------------------------------------------ 8 simulated devices

def _sharded_worker(path: str) -> None:
    from hat_jax.model.sharding import default_mesh, mesh_context
    from hat_jax.train.trainer import place_batch, state_shardings

    assert jax.device_count() == 8
    config = get_config("micro")
    # eps = 1 keeps Adam's update ~ linear in the gradient (with a tiny eps its first step is sign(g), which
    # turns reduction-order noise on near-zero gradients into +-lr differences).
    tx = make_optimizer(OptimConfig(lr=1e-2, warmup_steps=0, total_steps=4, eps=1.0))
    loss_fn = sft_loss_fn(Qwen3_5MoeForCausalLM(config))
    rng = np.random.default_rng(0)
    ids = rng.integers(3, config.vocab_size, (8, 20)).astype(np.int32)  # micro-batches of 4 rows: 1 per batch device
    host = split_micro_batches({"input_ids": ids, "attention_mask": np.ones_like(ids), "loss_mask": np.ones_like(ids)}, 2)
    finals = {}
    for name, mesh in (("single", None), ("mesh", default_mesh((2, 1, 2, 2)))):
        state = init_train_state(init_params(config, jax.random.key(0)), tx, jax.random.key(1))
        shardings = None
        if mesh is not None:
            shardings = state_shardings(state, tx, config, mesh)
            state = jax.device_put(state, shardings)
        step_fn = make_train_step(loss_fn, tx, lb_coef=0.01, shardings=shardings)
        with mesh_context(mesh):  # as `StageRun.run`: activation constraints and the token-local MoE dispatch
            for _ in range(2):
                state, metrics = step_fn(state, place_batch(host, mesh))
                if mesh is not None:
                    rows = {tuple(s.data.shape) for s in place_batch(host, mesh)["input_ids"].addressable_shards}
        finals[name] = jax.device_get(state.params)
        if mesh is not None:
            kernel = state.params["model"]["layers_3"]["self_attn"]["q_proj"]["kernel"]
            mu = state.opt_state[1][0].mu["model"]["layers_3"]["self_attn"]["q_proj"]["kernel"]
            split = {"params": kernel.addressable_shards[0].data.shape != kernel.shape,
                     "mu": mu.addressable_shards[0].data.shape != mu.shape, "sharding": str(kernel.sharding.spec),
                     "micro_batch_shards": sorted(rows)}
    diff = max(float(np.max(np.abs(a - b))) for a, b in
               zip(jax.tree_util.tree_leaves(finals["single"]), jax.tree_util.tree_leaves(finals["mesh"])))
    with open(path, "w") as f:
        json.dump({"max_abs_diff": diff, **split}, f)


def test_sharded_steps_match_single_device(tmp_path):
    out = tmp_path / "sharded.json"
    from device_worker import device_env  # here: this file also runs as the subprocess's script

    env = device_env(os.environ, 8)
    proc = subprocess.run([sys.executable, __file__, str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["params"] and result["mu"], result  # params and Adam moments really are split
    assert result["micro_batch_shards"] == [[2, 1, 20]], result  # [accum, rows, T]: one row per data x expert device
    assert result["max_abs_diff"] < 1e-5, result


if __name__ == "__main__":
    _sharded_worker(sys.argv[1])


def test_run_stage_with_a_batch_function_of_the_state(tmp_path):
    """On-policy stages pass `batches(state)`: it sees the state after the previous update (rollouts from the
    current params), its None ends the stage early, and the final checkpoint is still written."""
    tx = make_optimizer(OptimConfig(lr=0.1, warmup_steps=0, total_steps=10, clip_norm=None))
    step_fn = make_train_step(toy_loss, tx, donate=False)
    state = init_train_state({"w": jnp.asarray(2.0)}, tx, jax.random.key(0))
    seen = []

    def batches(s):
        seen.append((int(s.step), float(s.params["w"])))
        return None if int(s.step) == 3 else toy_batch()

    checkpointer = StageCheckpointer(tmp_path, {"stage": "toy"}, async_save=False)
    loop = LoopConfig(steps=10, log_every=1, ckpt_every=100, progress=False)
    final = run_stage(loop, state, batches, step_fn, checkpointer=checkpointer)
    checkpointer.close()
    assert [s for s, _ in seen] == [0, 1, 2, 3] and int(final.step) == 3
    assert len({w for _, w in seen}) == 4  # a new w at every call: the function got the updated state
    assert sorted(int(p.name) for p in tmp_path.iterdir() if p.name.isdigit()) == [3]


def _overflow_run(tmp_path, lr, steps=3):
    """A run whose update overflows the parameters (loss and grad finite at the step that breaks them); plain SGD,
    since OptimConfig refuses such a learning rate at construction."""
    tx = optax.sgd(lr)
    step_fn = make_train_step(toy_loss, tx)
    state = init_train_state({"w": jnp.asarray(2.0)}, tx, jax.random.key(0))
    checkpointer = StageCheckpointer(tmp_path, {"stage": "toy"}, async_save=False)
    loop = LoopConfig(steps=steps, log_every=1, ckpt_every=1, progress=False)
    try:
        return run_stage(loop, state, iter([toy_batch()] * steps), step_fn, checkpointer=checkpointer)
    finally:
        checkpointer.close()


def test_non_finite_updated_params_are_never_saved(tmp_path):
    """SGD at lr = 1e39: step 1's loss and gradient norm are finite, its updated parameter is -inf (float32), so
    nothing is saved and the error names the parameters."""
    with pytest.raises(NonFiniteLossError, match=r"non-finite updated parameters at step 1 \(loss=.*grad_norm=.*\); "
                                                 r"stopped without saving step 1, no checkpoint was written") as err:
        _overflow_run(tmp_path, lr=1e39)
    assert err.value.quantity == "updated parameters" and err.value.step == 1
    assert not [p for p in tmp_path.iterdir() if p.name.isdigit()]


def test_finite_flag_is_one_fused_scalar_in_the_metrics():
    tx = make_optimizer(OptimConfig(lr=0.1, warmup_steps=0, total_steps=10))
    step_fn = make_train_step(toy_loss, tx)
    state = init_train_state({"w": jnp.asarray(2.0)}, tx, jax.random.key(0))
    state, metrics = step_fn(state, toy_batch())
    assert metrics["finite"].shape == () and float(metrics["finite"]) == 1.0
    _, metrics = step_fn(state, toy_batch(poison=1.0))
    assert float(metrics["finite"]) == 0.0
    assert float(finite_flag({"loss": jnp.asarray(1.0)}, {"a": jnp.asarray([1.0, jnp.inf])})) == 0.0
    assert float(finite_flag({"grad_norm": jnp.asarray(jnp.nan)}, {"a": jnp.ones(2)})) == 0.0
    assert float(finite_flag({"loss": jnp.asarray(1.0)}, {"a": jnp.ones(2), "i": jnp.arange(3)})) == 1.0


def test_non_finite_gradient_norm_is_named(tmp_path):
    def grad_blowup(params, micro, rng):  # finite loss, infinite gradient: sqrt'(0)
        return jnp.sqrt(jnp.abs(params["w"] - 2.0)), jnp.asarray(1.0), {}

    tx = make_optimizer(OptimConfig(lr=0.1, warmup_steps=0, total_steps=10, clip_norm=None))
    step_fn = make_train_step(grad_blowup, tx)
    state = init_train_state({"w": jnp.asarray(2.0)}, tx, jax.random.key(0))
    with pytest.raises(NonFiniteLossError, match=r"non-finite grad_norm at step 1") as err:
        run_stage(LoopConfig(steps=2, progress=False), state, iter([toy_batch()] * 2), step_fn)
    assert err.value.quantity == "grad_norm"


def test_log_window_means_leave_out_steps_without_loss_tokens():
    """A step whose rows lost every loss token reports loss 0: not a measurement, so the window's per-token means
    (loss, lb_loss, total_loss, mtp_loss) skip it; its grad norm and token count stay in the window."""
    from hat_jax.train.trainer import _LogWindow

    class Writer:
        def scalars(self, step, values):
            self.step, self.values = step, values

    writer, window = Writer(), _LogWindow(0)
    for i, (loss, n) in enumerate([(7.0, 10), (0.0, 0), (8.0, 30)]):
        window.add({"loss": loss, "lb_loss": loss / 7, "mtp_loss": loss + 1, "loss_tokens": n, "grad_norm": float(i)},
                   100, float(i))
    window.emit(LoopConfig(steps=3, progress=False), 3, 3.0, writer)
    assert writer.step == 3
    assert writer.values["train/loss"] == 7.5 and writer.values["train/mtp_loss"] == 8.5
    assert writer.values["train/lb_loss"] == (1.0 + 8.0 / 7) / 2
    assert writer.values["train/grad_norm"] == 1.0 and writer.values["train/loss_tokens"] == 40 / 3
    window.add({"loss": 0.0, "loss_tokens": 0, "grad_norm": 2.0}, 100, 4.0)
    window.emit(LoopConfig(steps=4, progress=False), 4, 5.0, writer)
    assert "train/loss" not in writer.values and writer.values["train/grad_norm"] == 2.0


def test_log_line_shows_the_loops_chosen_metrics(caplog):
    """`LoopConfig.shown`: the window's means of those keys follow the loss in the log line, by their last name;
    a key the window lacks is left out; a step where a metric is undefined (NaN) is left out of its mean."""
    from hat_jax.train.trainer import _LogWindow, shown_values

    window = _LogWindow(0)
    for i, (reward, calls, valid) in enumerate([(0.5, 2.0, 100.0), (1.0, 0.0, math.nan), (0.0, 1.0, 50.0)]):
        window.add({"loss": 0.25, "reward/total": reward, "rollout/calls_per_ep": calls, "rollout/name_valid": valid},
                   10, float(i))
    loop = LoopConfig(steps=3, progress=False, shown=("reward/total", "rollout/calls_per_ep", "rollout/name_valid",
                                                      "rollout/chain_done"))
    with caplog.at_level("INFO", logger="hat_jax.train.trainer"):
        window.emit(loop, 3, 3.0, None)
    assert "step 3/3 loss 0.2500, total 0.50, calls_per_ep 1.00, name_valid 75.00, 1.50 s/step" in caplog.text
    assert shown_values(loop.shown, {"rollout/name_valid": math.nan}) == {"name_valid": "n/a"}
    assert shown_values(("a/b", "c"), {"a/b": 2 / 3, "c": 99.996}) == {"b": "0.67", "c": "100.00"}
    for bad in (("reward/accuracy", "eval/accuracy"), ("train/loss",), ("tok_s",)):
        with pytest.raises(ValueError, match="LoopConfig.shown"):
            LoopConfig(steps=1, shown=bad)


def test_log_window_mean_of_an_all_undefined_metric_is_nan():
    from hat_jax.train.trainer import _LogWindow

    class Writer:
        def scalars(self, step, values):
            self.values = values

    writer, window = Writer(), _LogWindow(0)
    for i in range(2):
        window.add({"loss": 1.0, "rollout/name_valid": math.nan}, 10, float(i))
    window.emit(LoopConfig(steps=2, progress=False), 2, 2.0, writer)
    assert math.isnan(writer.values["rollout/name_valid"]) and writer.values["train/loss"] == 1.0
