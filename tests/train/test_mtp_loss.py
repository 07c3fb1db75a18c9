"""The MTP loss of the stages (`hat_jax.train.mtp`) on the micro model, fp32: mtp_coef = 0 leaves the step exactly
the main objective's, mtp_coef > 0 adds exactly coef x the MTP head's token-mean CE (SFT, RL with its advantage
independence, OPD), the vocabulary-chunked CE equals the full-logits one (packed rows, scan + remat), and bad
coefficients are refused naming the field."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hat_jax.model import Qwen3_5MoeForCausalLM, get_config, init_params
from hat_jax.model.transformer import mtp_loss
from hat_jax.train.losses import masked_token_ce_sum
from hat_jax.train.mtp import check_mtp_model, mtp_ce_chunked, mtp_ce_counted_rows, mtp_target_mask
from hat_jax.train.opd_config import OPDConfig
from hat_jax.train.opd_loss import opd_loss_fn
from hat_jax.train.pretrain import PretrainConfig
from hat_jax.train.rl import RLConfig
from hat_jax.train.rl_loss import rl_loss_fn
from hat_jax.train.sft import SFTConfig, sft_loss_fn
from hat_jax.train.trainer import accumulate_gradients, moe_aux, output_router_stats

B, T = 2, 12


@pytest.fixture(scope="module")
def micro():
    config = get_config("micro")
    return config, init_params(config, jax.random.key(0))


def _packed_batch():
    """Two packed rows: documents [1 x 5, 2 x 4] and [3 x 9], padding after; loss tokens from position 2."""
    seg = np.array([[1] * 5 + [2] * 4 + [0] * 3, [3] * 9 + [0] * 3], np.int32)
    ids = np.random.RandomState(0).randint(1, 512, (B, T)).astype(np.int32) * (seg > 0)
    loss_mask = (seg > 0).astype(np.int32)
    loss_mask[:, :2] = 0
    loss_mask[0, 6] = 0
    return {"input_ids": jnp.asarray(ids), "segment_ids": jnp.asarray(seg), "loss_mask": jnp.asarray(loss_mask)}


def _rl_batch(advantages):
    rows = np.random.RandomState(1)
    ids = rows.randint(1, 512, (B, T)).astype(np.int32)
    att = np.ones((B, T), np.int32)
    att[1, 9:] = 0
    act = np.zeros((B, T), np.int32)
    act[:, 4:] = 1
    act *= att
    return {"input_ids": jnp.asarray(ids * att), "attention_mask": jnp.asarray(att), "action_mask": jnp.asarray(act),
            "old_logprobs": jnp.asarray(-rows.rand(B, T).astype(np.float32) * act),
            "advantages": jnp.asarray(advantages, jnp.float32)}


def _one_micro(batch):
    return {k: v[None] for k, v in batch.items()}


def _grads_equal(a, b):
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=jax.tree_util.keystr(path))


def test_mtp_coef_zero_is_the_main_objective_exactly(micro):
    config, params = micro
    model = Qwen3_5MoeForCausalLM(config, router_stats=True)
    batch, lb_coef = _packed_batch(), 0.01
    run = jax.jit(lambda fn, coef: accumulate_gradients(fn, params, _one_micro(batch), jax.random.key(0), lb_coef,
                                                        coef), static_argnums=(0, 1))
    off_grads, off_stats = run(sft_loss_fn(model, mtp=False), 0.0)

    def main_only(p, micro, rng):  # the SFT loss function as written before the MTP loss existed
        del rng
        out = model.apply({"params": p}, micro["input_ids"], segment_ids=micro["segment_ids"])
        ce, n = masked_token_ce_sum(out.logits, micro["input_ids"], micro["loss_mask"], micro["segment_ids"])
        return ce, n, moe_aux(output_router_stats(out, micro["segment_ids"] > 0, config.num_experts_per_tok))

    ref, ref_stats = run(main_only, 0.0)
    _grads_equal(off_grads, ref)
    assert "mtp_loss" not in off_stats and float(off_stats["total_loss"]) == float(ref_stats["total_loss"])
    # the MTP block run but weighted 0: the main model's gradient is still exactly the same, the MTP block's 0
    on_grads, on_stats = run(sft_loss_fn(model, mtp=True), 0.0)
    _grads_equal({k: v for k, v in on_grads.items() if k != "mtp"}, {k: v for k, v in ref.items() if k != "mtp"})
    for leaf in jax.tree_util.tree_leaves(on_grads["mtp"]) + jax.tree_util.tree_leaves(off_grads["mtp"]):
        assert not np.any(np.asarray(leaf))
    assert float(on_stats["mtp_loss"]) > 0 and float(on_stats["total_loss"]) == float(off_stats["total_loss"])


@pytest.mark.parametrize("block_rows", [256, None])  # position blocks (the stages) / full MTP logits (AOT FLOPs)
def test_sft_total_is_main_plus_coef_times_mtp_loss(micro, block_rows):
    config, params = micro
    model = Qwen3_5MoeForCausalLM(config, router_stats=True)
    batch, lb_coef, coef = _packed_batch(), 0.01, 0.3
    loss_fn = sft_loss_fn(model, mtp=True, block_rows=block_rows)
    grads, stats = jax.jit(lambda: accumulate_gradients(loss_fn, params, _one_micro(batch), jax.random.key(0),
                                                        lb_coef, coef))()

    def by_hand(p):
        out = model.apply({"params": p}, batch["input_ids"], segment_ids=batch["segment_ids"], with_mtp=True)
        ce, n = masked_token_ce_sum(out.logits, batch["input_ids"], batch["loss_mask"], batch["segment_ids"])
        lb = moe_aux(output_router_stats(out, batch["segment_ids"] > 0, config.num_experts_per_tok))["lb_loss"]
        mtp = mtp_loss(out.mtp_logits, batch["input_ids"], batch["loss_mask"], batch["segment_ids"])
        return ce / n + lb_coef * lb + coef * mtp, (ce / n, lb, mtp)

    (total, (main, lb, mtp)), ref = jax.jit(jax.value_and_grad(by_hand, has_aux=True))(params)
    np.testing.assert_allclose(float(stats["mtp_loss"]), float(mtp), rtol=1e-6)
    np.testing.assert_allclose(float(stats["loss"]), float(main), rtol=1e-6)
    np.testing.assert_allclose(float(stats["total_loss"]), float(main + lb_coef * lb + coef * mtp), rtol=1e-6)
    np.testing.assert_allclose(float(stats["total_loss"]), float(total), rtol=1e-6)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree_util.tree_leaves(ref)):
        # fp32 sums in another order (the loss in position blocks, the gradient accumulation): measured up to
        # 1.3e-7 apart on embedding entries of ~1.7e-3
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=5e-7,
                                   err_msg=jax.tree_util.keystr(path))
    assert any(np.any(np.asarray(g)) for g in jax.tree_util.tree_leaves(grads["mtp"]))


def test_rl_mtp_term_is_on_sampled_tokens_and_independent_of_the_advantage(micro):
    config, params = micro
    model = Qwen3_5MoeForCausalLM(config, router_stats=True)
    fn, coef = rl_loss_fn(model, mtp=True), 0.2
    step = jax.jit(lambda b: accumulate_gradients(fn, params, _one_micro(b), jax.random.key(0), 0.0, coef))
    g1, s1 = step(_rl_batch([1.0, -0.5]))
    g2, s2 = step(_rl_batch([-3.0, 2.0]))
    batch = _rl_batch([1.0, -0.5])
    out = model.apply({"params": params}, batch["input_ids"], attention_mask=batch["attention_mask"], with_mtp=True)
    mtp = float(mtp_loss(out.mtp_logits, batch["input_ids"], batch["action_mask"]))
    assert float(s1["mtp_loss"]) == float(s2["mtp_loss"])
    np.testing.assert_allclose(float(s1["mtp_loss"]), mtp, rtol=1e-6)
    for s in (s1, s2):
        np.testing.assert_allclose(float(s["total_loss"]), float(s["loss"]) + coef * mtp, rtol=1e-6)
    _grads_equal(g1["mtp"], g2["mtp"])  # the MTP block's gradient never sees the advantage
    assert float(s1["loss"]) != float(s2["loss"])


def _without_mtp(grads):
    return {k: v for k, v in grads.items() if k != "mtp"}


@pytest.mark.parametrize("vocab_chunk", [None, 128])
def test_rl_detached_mtp_loss_leaves_the_policy_gradient_as_it_is(micro, vocab_chunk):
    config, params = micro
    model = Qwen3_5MoeForCausalLM(config, router_stats=True)
    batch = _one_micro(_rl_batch([1.0, -0.5]))

    def grads(detach, coef):
        fn = rl_loss_fn(model, mtp=True, mtp_detach_trunk=detach, vocab_chunk=vocab_chunk)
        return jax.jit(lambda: accumulate_gradients(fn, params, batch, jax.random.key(0), 0.0, coef))()

    ref, ref_stats = grads(True, 0.0)
    held, held_stats = grads(True, 0.5)
    # the trunk, embedding and lm_head see the policy loss only; the MTP block learns from its own loss
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(_without_mtp(held)),
                            jax.tree_util.tree_leaves(_without_mtp(ref))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-9, err_msg=jax.tree_util.keystr(path))
    assert float(held_stats["mtp_loss"]) == float(ref_stats["mtp_loss"]) > 0
    assert all(np.any(np.asarray(g)) for g in jax.tree_util.tree_leaves(held["mtp"]["fc"]))
    # without the detach the same loss moves the policy: lm_head and embedding gradients change
    full, _ = grads(False, 0.5)
    for name in ("lm_head", "model"):
        diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                   for a, b in zip(jax.tree_util.tree_leaves(full[name]), jax.tree_util.tree_leaves(ref[name])))
        assert diff > 1e-6, name


def test_opd_detached_mtp_loss_leaves_the_distillation_gradient_as_it_is(micro):
    config, params = micro
    model = Qwen3_5MoeForCausalLM(config, router_stats=True)
    batch = _rl_batch([0.0, 0.0])
    batch["teacher_logprobs"] = batch.pop("advantages")[:, None] + batch["old_logprobs"] - 0.1

    def grads(coef):
        fn = opd_loss_fn(model, OPDConfig(init="unused", mtp_coef=max(coef, 0.5)))
        return jax.jit(lambda: accumulate_gradients(fn, params, _one_micro(batch), jax.random.key(0), 0.0, coef))()

    (ref, _), (held, _) = grads(0.0), grads(0.5)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(_without_mtp(held)),
                            jax.tree_util.tree_leaves(_without_mtp(ref))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-9, err_msg=jax.tree_util.keystr(path))


def test_opd_mtp_term_is_on_the_students_tokens(micro):
    config, params = micro
    model = Qwen3_5MoeForCausalLM(config, router_stats=True)
    opd = OPDConfig(init="unused", mtp_coef=0.5)
    batch = _rl_batch([0.0, 0.0])
    batch["teacher_logprobs"] = batch.pop("advantages")[:, None] + batch["old_logprobs"] - 0.1
    _, stats = jax.jit(lambda: accumulate_gradients(opd_loss_fn(model, opd), params, _one_micro(batch),
                                                    jax.random.key(0), 0.0, opd.mtp_coef))()
    out = model.apply({"params": params}, batch["input_ids"], attention_mask=batch["attention_mask"], with_mtp=True)
    mtp = float(mtp_loss(out.mtp_logits, batch["input_ids"], batch["action_mask"]))
    np.testing.assert_allclose(float(stats["mtp_loss"]), mtp, rtol=1e-6)
    np.testing.assert_allclose(float(stats["total_loss"]), float(stats["loss"]) + 0.5 * mtp, rtol=1e-6)


def test_chunked_and_counted_rows_mtp_ce_equal_full_logits(micro):
    config, params = micro
    model = Qwen3_5MoeForCausalLM(config)
    batch = _packed_batch()
    ids, seg, mask = batch["input_ids"], batch["segment_ids"], batch["loss_mask"]
    out = model.apply({"params": params}, ids, segment_ids=seg, with_mtp=True)
    kernel = params["lm_head"]["kernel"]
    for loss_mask, segment_ids in ((mask, seg), (None, seg), (mask, None)):
        full = mtp_loss(out.mtp_logits, ids, loss_mask, segment_ids)
        for chunk in (96, 512):  # a last partial chunk, and one chunk
            got = mtp_ce_chunked(out.mtp_hidden, kernel, ids, loss_mask, segment_ids, chunk)
            np.testing.assert_allclose(float(got), float(full), rtol=1e-5)
        for rows in (5, 7, 256):  # blocks of positions, the all-0 ones skipped; a last partial block; one block
            got = mtp_ce_counted_rows(out.mtp_hidden, kernel, ids, loss_mask, segment_ids, rows)
            np.testing.assert_allclose(float(got), float(full), rtol=1e-5)
    # the model without logits returns the same MTP hidden states (what the chunked stages read)
    bare = model.apply({"params": params}, ids, segment_ids=seg, with_mtp=True, return_logits=False)
    assert bare.logits is None and bare.mtp_logits is None
    np.testing.assert_array_equal(np.asarray(bare.mtp_hidden), np.asarray(out.mtp_hidden))
    # no position counts across a document boundary, nor the last two of a document
    np.testing.assert_array_equal(np.asarray(mtp_target_mask(ids, mask, seg))[0], [1, 1, 1, 0, 0, 1, 1, 0, 0, 0])


def test_chunked_mtp_loss_under_scan_and_remat_matches_the_loop(micro):
    config, params = micro
    batch = _one_micro(_packed_batch())
    plain = Qwen3_5MoeForCausalLM(config, router_stats=True)
    scanned = Qwen3_5MoeForCausalLM(config, router_stats=True, scan_layers=True, remat_policy="full")
    run = jax.jit(lambda m, chunk: accumulate_gradients(sft_loss_fn(m, chunk, mtp=True), params, batch,
                                                        jax.random.key(0), 0.01, 0.3), static_argnums=(0, 1))
    g_ref, s_ref = run(plain, None)
    g, s = run(scanned, 96)
    np.testing.assert_allclose(float(s["mtp_loss"]), float(s_ref["mtp_loss"]), rtol=1e-5)
    np.testing.assert_allclose(float(s["total_loss"]), float(s_ref["total_loss"]), rtol=1e-5)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g), jax.tree_util.tree_leaves(g_ref)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6,
                                   err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize("make", [lambda c: SFTConfig(mtp_coef=c), lambda c: RLConfig(mtp_coef=c),
                                  lambda c: OPDConfig(mtp_coef=c), lambda c: PretrainConfig(mtp_coef=c)])
def test_negative_mtp_coef_is_refused_naming_the_field(make):
    with pytest.raises(ValueError, match=r"Config\.mtp_coef = -0\.1"):
        make(-0.1)
    with pytest.raises(ValueError, match=r"mtp_coef = nan"):
        make(float("nan"))
    assert make(0.0).mtp_coef == 0.0


def test_mtp_coef_without_an_mtp_block_is_refused():
    no_mtp = get_config("micro", mtp_num_hidden_layers=0)
    with pytest.raises(ValueError, match=r"RLConfig\.mtp_coef = 0\.1: the model has no MTP block"):
        check_mtp_model("RLConfig", 0.1, no_mtp)
    check_mtp_model("RLConfig", 0.0, no_mtp)
    with pytest.raises(ValueError, match=r"PretrainConfig\.mtp_coef = 0\.1: the model has no MTP block"):
        PretrainConfig(model_overrides=(("mtp_num_hidden_layers", 0),), mtp_coef=0.1)
    assert dataclasses.replace(SFTConfig(), mtp_coef=0.0).mtp_coef == 0.0
