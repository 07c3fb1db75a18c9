"""The HSA-RL stage (hat_jax.train.rl) on the micro preset.

The init checkpoint is the micro architecture with a 4,096-token vocabulary and a BPE trained on the
production harness and oracle episodes (production prompt ~880 tokens, so rows of 1,024 tokens hold two
16-token turns), eos-biased as in tests/rollout/conftest.py so that turns end with `<|im_end|>` now and
then. The CoT penalty is made steep (free 2, -1 at 40 tokens) so rewards vary inside groups and the
advantages are not all 0.

- one RL step end to end for each estimator (with each aggregation mode, the KL reference and routing replay
  spread over them): finite loss, every documented tag logged, ratio 1 at the first update;
- accumulation over micro-batches equals the full batch for each aggregation mode (pure loss function);
- routing replay: the training forward with the recorded expert ids recomputes the sampler's logprobs;
- a NaN reward component drops the sample (mask zeroed, advantage 0) and is counted;
- HSA harness draws are deterministic per (seed, step, task) and differ from the production harness;
- a SIGKILLed 3-step run resumed with --resume ends bit-identical to an uninterrupted one;
- bad input: missing / incompatible init or reference, unknown estimator / aggregation names.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from process_helpers import sigkill_when_dir_appears
from hat_jax.judges.rewards import COMPONENTS
from hat_jax.model import Qwen3_5MoeForCausalLM, get_config, init_params
from hat_jax.model.checkpoint_io import load_model_checkpoint, save_model_checkpoint
from hat_jax.train.checkpoints import IncompatibleCheckpointError, latest_step
from hat_jax.train.metrics import check_tag, read_metrics
from hat_jax.train.policy_packing import pack_policy_batch
from hat_jax.train.rl import RLBatches, RLConfig, apply_rl_overrides, run_rl, step_harnesses
from hat_jax.train.optim import OptimConfig, lr_schedule, make_optimizer
from hat_jax.train.rl_loss import batch_aggregate, make_rl_train_step, policy_forward, rl_loss_fn
from hat_jax.train.rl_rewards import OUTCOMES, host_batch, judge_rewards
from hat_jax.train.stage import stage_section
from hat_jax.train.trainer import accumulate_gradients, init_train_state, split_micro_batches

VOCAB = 4096
SETS = ["seq_len=1024", "train_bucket=1024", "rollout_bucket=1024", "max_new_tokens=16", "max_turns=2",
        "reward.cot_free=2", "reward.cot_zero_at=40", "harness_mode=original"]
# HSA prompts reach ~2,000 tokens with this tokenizer.
HSA_SETS = ["harness_mode=hsa", "seq_len=2048", "rollout_bucket=2048", "train_bucket=2048"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    path = tmp_path_factory.mktemp("cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("HAT_JAX_CACHE", str(path))
    yield path
    mp.undo()


@pytest.fixture(scope="module")
def init_dir(tmp_path_factory, cache, world, harness):
    """A micro (vocab 4096) checkpoint with `tokenizer/`, eos-biased (module docstring)."""
    from hat_jax.harness.render import render_system_prompt, render_text
    from hat_jax.sim.env import LiveStreamEnv
    from hat_jax.sim.oracle import OracleTeacher
    from hat_jax.sim.rollout import rollout
    from hat_jax.sim.viewers import sample_tasks
    from hat_jax.tokenizer import train_bpe_tokenizer

    out = tmp_path_factory.mktemp("init")
    episodes = [rollout(LiveStreamEnv(world), OracleTeacher(world), t, harness) for t in sample_tasks(world, 12, 1)]
    base = [render_system_prompt(harness), *(json.dumps(t, ensure_ascii=False) for t in harness.openai_tools()),
            *(s.body for s in harness.skills)]
    first = train_bpe_tokenizer(base, 300, out / "bpe0")
    train_bpe_tokenizer(base + [render_text(first, harness, list(e.messages)) for e in episodes], VOCAB,
                        out / "tokenizer")
    config = get_config("micro", vocab_size=VOCAB)
    p = init_params(config, jax.random.key(0))
    kernel = (p["lm_head"]["kernel"] * 10.0).at[0, :].set(0.0).at[0, config.eos_token_id].set(0.5)
    embed = p["model"]["embed_tokens"]["embedding"].at[:, 0].set(1.0)
    p = {**p, "model": {**p["model"], "embed_tokens": {"embedding": embed}}, "lm_head": {"kernel": kernel}}
    save_model_checkpoint(out, p, config)
    return out


def micro(init_dir, *sets: str, steps: int = 1) -> RLConfig:
    config = apply_rl_overrides(stage_section("micro", "rl"), [f"init={init_dir}", *SETS, *sets])
    return dataclasses.replace(config, steps=steps)


DOCUMENTED = (
    [f"reward/{c}" for c in COMPONENTS] + [f"reward/{c}_norm" for c in COMPONENTS]
    + ["reward/total", "reward/total_norm", "adv/mean", "adv/std", "adv/abs_max", "adv/zero_frac",
       "rollout/reasoning_len", "rollout/tokens", "rollout/tokens_per_s", "rollout/turns", "rollout/truncated_frac",
       "rollout/seq_len", "time/generation_s", "time/env_s", "time/train_s", "time/rollout_s", "time/ref_s",
       "moe/expert_load_cv", "data/invalid_samples", "policy/clip_frac", "policy/clip_frac_low",
       "policy/clip_frac_high", "policy/ratio_mean", "policy/entropy", "kl/approx", "train/loss", "train/lb_loss",
       "train/grad_norm", "train/lr", "rollout/calls_per_ep", "rollout/name_valid", "rollout/skill_acc",
       "rollout/chain_done", "rollout/fact_fetched", "rollout/relayed", "rollout/abstained"]
    + [f"rollout/outcome_{o}" for o in OUTCOMES])


@pytest.mark.parametrize("estimator,sets", [
    ("grpo", ["aggregation=token-mean", "beta=0.05"]),
    ("gdpo", ["aggregation=seq-mean-token-mean", "routing_replay=true", *HSA_SETS]),
    ("dr_grpo", ["aggregation=seq-mean-token-sum-norm"]),
])
def test_one_step_per_estimator(init_dir, tmp_path, estimator, sets):
    config = micro(init_dir, f"estimator={estimator}", *sets)
    state = run_rl(config, tmp_path / "run", progress=False)
    assert int(state.step) == 1
    (row,) = read_metrics(tmp_path / "run")
    missing = [t for t in DOCUMENTED if t not in row]
    assert not missing, missing
    assert all(check_tag(t) for t in row if t not in ("step", "time"))
    assert np.isfinite(row["train/loss"]) and np.isfinite(row["train/grad_norm"])
    assert row["adv/std"] > 0  # the steep CoT penalty makes rewards differ inside groups
    assert row["data/invalid_samples"] == 0 and row["rollout/tokens"] > 0
    assert abs(row["policy/ratio_mean"] - 1.0) < 1e-4 and row["policy/clip_frac"] == 0.0  # on-policy first update
    if "routing_replay=true" in sets:
        assert row["policy/ratio_max"] < 1 + 1e-4
    assert sum(row[f"rollout/outcome_{o}"] for o in OUTCOMES) == pytest.approx(1.0)
    assert row["rollout/calls_per_ep"] >= 0 and 0 <= row["rollout/skill_acc"] <= 100
    if "beta=0.05" in sets:  # the reference is the init: k3 = 0 at the first update
        assert abs(row["kl/k3"]) < 1e-5 and row["time/ref_s"] > 0


@pytest.fixture(scope="module")
def replay_rollout(init_dir):
    config = micro(init_dir, "routing_replay=true", *HSA_SETS)  # the gdpo run's shapes: compiled once
    _, params = load_model_checkpoint(init_dir)
    from hat_jax.tokenizer import load_tokenizer

    batches = RLBatches(config, get_config("micro", vocab_size=VOCAB), load_tokenizer(init_dir / "tokenizer"))
    rollout, harnesses = batches.rollout(params, step=1)
    return config, batches, params, rollout, harnesses


def test_routing_replay_recomputes_sampler_logprobs(replay_rollout):
    config, batches, params, rollout, harnesses = replay_rollout
    comps, counts = judge_rewards(rollout, harnesses, batches.tokenizer, config.reward)
    batch, _ = host_batch(rollout, comps, counts, config)
    assert batch["expert_ids"].shape == (4, 4, -(-batches.model_config.num_experts_per_tok // 2), 2048)
    assert batch["input_ids"].shape == (4, 2048)
    model = Qwen3_5MoeForCausalLM(batches.model_config)
    lp, _ = jax.jit(lambda p, b: policy_forward(model, p, b, 1.0, True))(params, batch)
    m = rollout.action_mask.astype(bool)
    gap = np.abs(np.asarray(lp)[:, :m.shape[1]] - rollout.old_logprobs)[m]
    assert gap.max() < 1e-4, gap.max()


def test_packed_rollouts_keep_the_sampler_logprobs(replay_rollout):
    """Real rollouts (routing replay on) packed into rows of twice the width: the packed forward with the
    packed routing ids gives the sampler's log-probs, as the unpacked one does."""
    config, batches, params, rollout, harnesses = replay_rollout
    comps, counts = judge_rewards(rollout, harnesses, batches.tokenizer, config.reward)
    batch, _ = host_batch(rollout, comps, counts, config)
    width = 2 * batch["input_ids"].shape[1]
    wide = {k: np.concatenate([v, np.zeros(v.shape[:-1] + (width - v.shape[-1],), v.dtype)], axis=-1)
            if k != "advantages" else v for k, v in batch.items()}
    k = batches.model_config.num_experts_per_tok
    packed = pack_policy_batch(wide, aggregation=config.aggregation, max_len=config.max_len, top_k=k)
    assert packed["input_ids"].shape == (2, width) and (packed["segment_ids"] > 0).sum() == batch["attention_mask"].sum()
    model = Qwen3_5MoeForCausalLM(batches.model_config)
    lp = np.asarray(jax.jit(lambda p, b: policy_forward(model, p, b, 1.0, True))(params, packed)[0])
    m = packed["action_mask"].astype(bool)
    sampled = np.sort(rollout.old_logprobs[rollout.action_mask.astype(bool)])
    assert np.abs(np.sort(lp[m]) - sampled).max() < 1e-4
    np.testing.assert_allclose(np.sort(packed["old_logprobs"][m]), sampled, rtol=0, atol=0)


def test_nan_component_drops_the_sample(replay_rollout):
    config, batches, _, rollout, harnesses = replay_rollout
    comps, counts = judge_rewards(rollout, harnesses, batches.tokenizer, config.reward)
    comps = {k: np.ones_like(v) for k, v in comps.items()}
    comps["cot_length"][:] = [-0.5, 0.0, -1.0, -0.25]
    comps["accuracy"][1] = np.nan
    batch, metrics = host_batch(rollout, comps, counts, dataclasses.replace(config, routing_replay=False))
    assert metrics["data/invalid_samples"] == 1.0
    assert batch["action_mask"][1].sum() == 0 and rollout.action_mask[1].sum() > 0
    assert np.array_equal(batch["action_mask"][[0, 2, 3]], rollout.action_mask[[0, 2, 3]])
    # group 0 keeps one valid sample -> advantage 0; group 1 still compares its two samples
    assert batch["advantages"][0] == 0.0 and batch["advantages"][1] == 0.0
    assert batch["advantages"][2] < 0 < batch["advantages"][3]
    assert np.isfinite(list(metrics.values())).all()


def test_hsa_harness_draws(init_dir, harness):
    config = micro(init_dir, "harness_mode=hsa")
    a, b = step_harnesses(harness, config, 3, 4), step_harnesses(harness, config, 3, 4)
    assert [h.version for h in a] == [h.version for h in b]
    assert all(h.version != harness.version for h in a) and len({h.version for h in a}) > 1
    assert [h.version for h in step_harnesses(harness, config, 4, 4)] != [h.version for h in a]
    assert step_harnesses(harness, micro(init_dir), 3, 2) == [harness, harness]


class TinyLM:
    """Duck-typed stand-in for `Qwen3_5MoeForCausalLM` (what `rl_loss_fn` uses: .config.num_experts_per_tok and
    .apply -> .logits, .router_logits, .router_stats = None): logits_t = tanh(embed[ids] cumulated over t) @ out; jit-compiles in
    a blink, so the accumulation tests are about the loss function, not the model."""

    config = types.SimpleNamespace(num_experts_per_tok=2)

    @staticmethod
    def init(key, vocab=32, hidden=8, experts=4):
        k1, k2, k3 = jax.random.split(key, 3)
        return {"embed": jax.random.normal(k1, (vocab, hidden)), "out": jax.random.normal(k2, (hidden, vocab)),
                "router": jax.random.normal(k3, (hidden, experts))}

    def apply(self, variables, ids, attention_mask=None, forced_expert_ids=None):
        p = variables["params"]
        h = jnp.tanh(jnp.cumsum(p["embed"][ids], axis=1) / 4.0)
        return types.SimpleNamespace(logits=h @ p["out"], router_logits=(h @ p["router"]).reshape(1, -1, 4),
                                     router_stats=None)


class TinyHeadLM(TinyLM):
    """`TinyLM` with its output matrix as the lm_head kernel and the hidden states in the output, so the
    vocabulary-chunked loss can run on it."""

    dtype = jnp.float32

    @staticmethod
    def init(key, vocab=32, hidden=8, experts=4):
        p = TinyLM.init(key, vocab, hidden, experts)
        return {"embed": p["embed"], "lm_head": {"kernel": p.pop("out")}, "router": p["router"]}

    def apply(self, variables, ids, attention_mask=None, forced_expert_ids=None, return_logits=True):
        p = variables["params"]
        h = jnp.tanh(jnp.cumsum(p["embed"][ids], axis=1) / 4.0)
        return types.SimpleNamespace(logits=h @ p["lm_head"]["kernel"] if return_logits else None, hidden=h,
                                     router_logits=(h @ p["router"]).reshape(1, -1, 4), router_stats=None)


def test_vocab_chunked_rl_loss_equals_full_logits():
    model, batch = TinyHeadLM(), toy_rl_batch()
    params = TinyHeadLM.init(jax.random.key(2))
    batch = {k: jnp.asarray(v) for k, v in batch.items()}
    batch["ref_logprobs"] = batch["old_logprobs"] - 0.1
    results = []
    for chunk in (None, 10):  # 32 = 3 chunks of 10 + a shifted last chunk
        loss_fn = rl_loss_fn(model, temperature=0.7, beta=0.05, vocab_chunk=chunk)
        results.append(jax.jit(jax.value_and_grad(lambda p: loss_fn(p, batch, None)[0]))(params))
        results[-1] += (jax.jit(lambda p: loss_fn(p, batch, None)[2])(params),)
    (v0, g0, aux0), (v1, g1, aux1) = results
    np.testing.assert_allclose(v1, v0, atol=1e-6, rtol=0)
    for a, b in zip(jax.tree_util.tree_leaves(g1), jax.tree_util.tree_leaves(g0)):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
    for key in ("policy/entropy", "kl/k3", "kl/approx"):
        np.testing.assert_allclose(aux1[key], aux0[key], atol=1e-6, rtol=0, err_msg=key)
    assert float(aux0["policy/entropy"]) > 0.5


def toy_rl_batch(b=4, t=12, vocab=32):
    rng = np.random.default_rng(0)
    batch = {"input_ids": rng.integers(1, vocab, (b, t)).astype(np.int32),
             "attention_mask": np.ones((b, t), np.int32), "action_mask": np.zeros((b, t), np.int32),
             "old_logprobs": rng.normal(-3.4, 0.4, (b, t)).astype(np.float32),
             "advantages": np.asarray([1.0, -0.5, 0.7, -2.0], np.float32)}
    batch["attention_mask"][1, 9:] = 0
    for row, (lo, hi) in enumerate([(2, 11), (5, 7), (3, 3), (1, 3)]):  # unequal lengths; row 2 has no action
        batch["action_mask"][row, lo:hi] = 1
    return batch


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_accumulation_equals_full_batch(mode):
    model, batch = TinyLM(), toy_rl_batch()
    params = TinyLM.init(jax.random.key(0))
    loss_fn = rl_loss_fn(model, aggregation=mode, max_len=20, eps_low=0.2, eps_high=0.28, temperature=0.7)
    grad = jax.jit(lambda p, bt: accumulate_gradients(loss_fn, p, bt, jax.random.key(1), 0.0))
    full, full_stats = grad(params, split_micro_batches(batch, 1))
    acc, acc_stats = grad(params, split_micro_batches(batch, 4))   # one sequence per micro-batch
    # The reference: the batch-level aggregate of the per-token clipped loss, computed directly in numpy.
    lp, _ = policy_forward(model, params, {k: jnp.asarray(v) for k, v in batch.items()}, 0.7, False)
    adv = batch["advantages"][:, None]
    ratio = np.exp(np.asarray(lp, np.float64) - batch["old_logprobs"])
    pg = np.maximum(-adv * ratio, -adv * np.clip(ratio, 0.8, 1.28))
    m = batch["action_mask"]
    want = {"token-mean": (pg * m).sum() / m.sum(),
            "seq-mean-token-mean": sum((pg[i] * m[i]).sum() / m[i].sum() for i in (0, 1, 3)) / 3,
            "seq-mean-token-sum-norm": (pg * m).sum() / (3 * 20)}[mode]
    assert float(batch_aggregate(jnp.asarray(pg), m, mode, max_len=20)) == pytest.approx(want, rel=1e-6)
    assert float(full_stats["loss"]) == pytest.approx(want, rel=1e-5)
    assert float(acc_stats["loss"]) == pytest.approx(want, rel=1e-5)
    for (path, g_full), g_acc in zip(jax.tree_util.tree_leaves_with_path(full), jax.tree_util.tree_leaves(acc)):
        np.testing.assert_allclose(g_acc, g_full, atol=1e-6, rtol=1e-5, err_msg=jax.tree_util.keystr(path))


def test_ppo_epochs_and_minibatches_are_sequential_updates():
    model, batch = TinyLM(), toy_rl_batch()
    params = TinyLM.init(jax.random.key(0))
    optim = OptimConfig(lr=0.05, total_steps=8, min_lr_ratio=1.0)
    tx = make_optimizer(optim)
    loss_fn = rl_loss_fn(model, aggregation="token-mean")
    step = make_rl_train_step(loss_fn, tx, accum_steps=1, epochs=2, minibatches=2, schedule=lr_schedule(optim),
                              donate=False)
    state = init_train_state(params, tx, jax.random.key(0))
    new, metrics = step(state, split_micro_batches(batch, 2))
    assert int(new.step) == 1 and float(metrics["lr"]) == pytest.approx(0.05)
    # by hand: minibatch 0 (rows 0-1), minibatch 1 (rows 2-3), twice
    p, opt = params, tx.init(params)
    halves = [{k: v[None, :2] for k, v in batch.items()}, {k: v[None, 2:] for k, v in batch.items()}]
    for _ in range(2):
        for half in halves:
            g, _ = accumulate_gradients(loss_fn, p, half, jax.random.key(0), 0.0)
            u, opt = tx.update(g, opt, p)
            p = optax.apply_updates(p, u)
    for a, b in zip(jax.tree_util.tree_leaves(new.params), jax.tree_util.tree_leaves(p)):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_aggregation_modes_differ_as_the_formulas_say():
    pg = jnp.asarray([[0.0, 1.0, 1.0, 1.0], [0.0, 4.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    mask = jnp.asarray([[0, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0]])  # row 2: a dropped sample, not a sequence
    assert float(batch_aggregate(pg, mask, "token-mean")) == pytest.approx(7 / 4)
    assert float(batch_aggregate(pg, mask, "seq-mean-token-mean")) == pytest.approx((1 + 4) / 2)
    assert float(batch_aggregate(pg, mask, "seq-mean-token-sum-norm", max_len=10)) == pytest.approx(7 / (2 * 10))


def test_bad_names_and_checkpoints(init_dir, tmp_path):
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'; valid: grpo, gdpo, dr_grpo"):
        RLConfig(estimator="ppo")
    with pytest.raises(ValueError, match="unknown loss aggregation 'mean'; valid: token-mean, seq-mean-token-mean"):
        apply_rl_overrides(stage_section("micro", "rl"), ["aggregation=mean"])
    with pytest.raises(ValueError, match="harness_mode = 'both'; valid: original, hsa"):
        RLConfig(harness_mode="both")
    with pytest.raises(ValueError, match="no model.* overrides"):
        apply_rl_overrides(stage_section("micro", "rl"), ["model.vocab_size=4"])
    with pytest.raises(FileNotFoundError, match="RL init checkpoint .*missing.* does not exist"):
        run_rl(micro(tmp_path / "missing"), tmp_path / "a", progress=False)
    other = get_config("micro", vocab_size=VOCAB, hidden_size=32)
    save_model_checkpoint(tmp_path / "ref", init_params(other, jax.random.key(0)), other)
    with pytest.raises(IncompatibleCheckpointError, match=r"ref.*lm_head/kernel has shape \(32, 4096\), the stage "
                                                          r"expects \(64, 4096\)"):
        run_rl(micro(init_dir, "beta=0.1", f"ref={tmp_path / 'ref'}"), tmp_path / "b", progress=False)
    save_model_checkpoint(tmp_path / "notok", init_params(other, jax.random.key(0)), other)
    with pytest.raises(FileNotFoundError, match="notok.* has no tokenizer"):
        run_rl(micro(tmp_path / "notok"), tmp_path / "c", progress=False)


# ---------------------------------------------------------------------------------------------- exact resume

def test_killed_run_resumes_bit_identically(init_dir, tmp_path):
    """The killed run is a CLI subprocess, SIGKILLed by a watcher process as soon as its step-2 checkpoint is in
    place; meanwhile the uninterrupted reference runs in this process; the resume runs here too."""
    out = tmp_path / "killed"
    sets = [a for s in SETS for a in ("--set", s)]
    proc = subprocess.Popen([sys.executable, "-m", "hat_jax.train.rl", "--preset", "micro", "--init", str(init_dir),
                             "--out", str(out), "--steps", "3", "--no-progress", *sets, "--set", "ckpt_every=1"],
                            env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    watcher = sigkill_when_dir_appears(proc, out / "2")
    config = dataclasses.replace(micro(init_dir, steps=3), init=str(Path(init_dir).resolve()), ckpt_every=1)
    run_rl(config, tmp_path / "ref", progress=False)
    watcher.wait()
    _, err = proc.communicate()
    assert proc.returncode == -signal.SIGKILL, err[-4000:]
    assert latest_step(out) == 2
    run_rl(config, out, resume=True, progress=False)
    _, want = load_model_checkpoint(tmp_path / "ref")
    _, got = load_model_checkpoint(out)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(want), jax.tree_util.tree_leaves(got)):
        assert np.array_equal(np.asarray(a), np.asarray(b)), f"{jax.tree_util.keystr(path)} differs after resume"
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[-1]["reward/total"] == read_metrics(tmp_path / "ref")[-1]["reward/total"]
