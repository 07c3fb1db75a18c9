"""Packing RL's sampled sequences: the first-fit-decreasing rows, the packed batch's layout, and the packed
update equal to the unpacked one (loss, gradients, routing replay)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hat_jax.model import Qwen3_5MoeForCausalLM, get_config, init_params
from hat_jax.rollout.episodes import pack_expert_ids
from hat_jax.train.policy_packing import first_fit_decreasing, pack_policy_batch
from hat_jax.train.rl_loss import policy_forward, rl_loss_fn
from hat_jax.train.trainer import accumulate_gradients, split_micro_batches

LENGTHS = (9, 4, 12, 3, 5, 7)   # six right-padded sequences in rows of 16
T = 16


def test_first_fit_decreasing_rows():
    assert first_fit_decreasing([5, 3, 4, 2, 6], 8) == [[4, 3], [0, 1], [2]]
    assert first_fit_decreasing([2, 2, 2], 8) == [[0, 1, 2]]          # equal lengths keep their order
    assert first_fit_decreasing([], 8) == []
    with pytest.raises(ValueError, match="sequence 1: 9 tokens; expected 1..8"):
        first_fit_decreasing([3, 9], 8)
    with pytest.raises(ValueError, match="sequence 0: 0 tokens"):
        first_fit_decreasing([0], 8)


def _batch(lengths=LENGTHS, vocab=512, seed=0):
    rng = np.random.default_rng(seed)
    n = len(lengths)
    att = (np.arange(T)[None, :] < np.asarray(lengths)[:, None]).astype(np.int32)
    act = np.zeros((n, T), np.int32)
    for i, length in enumerate(lengths):
        if i != 3:                                                    # sequence 3 has no sampled token
            act[i, length // 2:length] = 1
    return {"input_ids": (rng.integers(1, vocab, (n, T)) * att).astype(np.int32), "attention_mask": att,
            "action_mask": act, "old_logprobs": (rng.normal(-3.0, 0.5, (n, T)) * act).astype(np.float32),
            "advantages": rng.normal(0.0, 1.0, n).astype(np.float32)}


def test_packed_layout_keeps_each_sequence_and_its_minibatch():
    batch = _batch()
    packed = pack_policy_batch(batch, aggregation="token-mean", minibatches=2, rows_multiple=1)
    # minibatch 0 = sequences 0-2 (9, 4, 12: rows [12, 4], [9]); minibatch 1 = 3-5 (3, 5, 7: one row)
    assert packed["input_ids"].shape == (4, T)
    np.testing.assert_array_equal(packed["segment_ids"][0], [1] * 12 + [2] * 4)
    np.testing.assert_array_equal(packed["input_ids"][0], np.r_[batch["input_ids"][2, :12], batch["input_ids"][1, :4]])
    np.testing.assert_array_equal(packed["segment_ids"][1], [1] * 9 + [0] * 7)
    np.testing.assert_array_equal(packed["segment_ids"][2], [1] * 7 + [2] * 5 + [3] * 3 + [0])
    assert not packed["segment_ids"][3].any()                         # minibatch 0's second row count, padded
    np.testing.assert_array_equal(packed["advantages"][2, :7], batch["advantages"][5] * batch["action_mask"][5, :7])
    assert packed["action_mask"].sum() == batch["action_mask"].sum() == packed["loss_counts"].sum()
    # rows_multiple rounds each minibatch's rows up; no saving -> None (the update stays unpacked)
    assert pack_policy_batch(batch, aggregation="token-mean", minibatches=2, rows_multiple=3) is None
    assert pack_policy_batch(_batch((16, 15, 14)), aggregation="token-mean") is None


def test_left_padded_rows_pack_as_right_padded_ones():
    batch = _batch()
    left = {k: np.stack([np.roll(v[i], T - n) for i, n in enumerate(LENGTHS)]) if k != "advantages" else v
            for k, v in batch.items()}
    want, got = (pack_policy_batch(b, aggregation="seq-mean-token-mean") for b in (batch, left))
    assert want.keys() == got.keys()
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_bad_batches_are_refused():
    batch = _batch()
    with pytest.raises(ValueError, match="not divisible into minibatches=4"):
        pack_policy_batch(batch, aggregation="token-mean", minibatches=4)
    with pytest.raises(ValueError, match="needs max_len"):
        pack_policy_batch(batch, aggregation="seq-mean-token-sum-norm")
    gap = dict(batch, attention_mask=batch["attention_mask"].copy())
    gap["attention_mask"][2, 5] = 0
    with pytest.raises(ValueError, match="row 2 of the policy batch: its tokens must be one non-empty run"):
        pack_policy_batch(gap, aggregation="token-mean")
    with pytest.raises(ValueError, match=r"batch\['old_logprobs'\] has shape \(6, 15\)"):
        pack_policy_batch(dict(batch, old_logprobs=batch["old_logprobs"][:, 1:]), aggregation="token-mean")
    with pytest.raises(ValueError, match="expert_ids need top_k"):
        pack_policy_batch(dict(batch, expert_ids=np.zeros((6, 2, 1, T), np.int32)), aggregation="token-mean")
    with pytest.raises(ValueError, match=r"batch\['expert_ids'\] has shape \(6, 2, 1, 17\); expected \[6, L, 1, 16\]"):
        pack_policy_batch(dict(batch, expert_ids=np.zeros((6, 2, 1, T + 1), np.int32)), aggregation="token-mean",
                          top_k=2)
    with pytest.raises(ValueError, match=r"batch\['attention_mask'\] has shape \(3, 16\); expected \[6, 16\]"):
        pack_policy_batch(dict(batch, attention_mask=batch["attention_mask"][:3]), aggregation="token-mean")
    with pytest.raises(ValueError, match=r"batch\['advantages'\] has shape \(6, 16\); expected \[6\]"):
        pack_policy_batch(dict(batch, advantages=batch["old_logprobs"]), aggregation="token-mean")
    with pytest.raises(ValueError, match="rows_multiple = 0; expected an integer >= 1"):
        pack_policy_batch(batch, aggregation="token-mean", rows_multiple=0)
    with pytest.raises(ValueError, match="needs max_len.*got -4"):
        pack_policy_batch(batch, aggregation="seq-mean-token-sum-norm", max_len=-4)
    with pytest.raises(ValueError, match="the batch has no action_mask"):
        pack_policy_batch({k: v for k, v in batch.items() if k != "action_mask"}, aggregation="token-mean")
    stray = dict(batch, action_mask=batch["action_mask"].copy())
    stray["action_mask"][4, T - 1] = 1
    with pytest.raises(ValueError, match="row 4 of the policy batch has action tokens on padding"):
        pack_policy_batch(stray, aggregation="token-mean")
    half = dict(batch, action_mask=batch["action_mask"].astype(np.float32))
    half["action_mask"][5] *= 0.5
    with pytest.raises(ValueError, match=r"batch\['action_mask'\] row 5 holds values other than 0 and 1"):
        pack_policy_batch(half, aggregation="token-mean")


@pytest.mark.parametrize("field", ["pack_rows", "mtp_detach_trunk"])
def test_the_switches_take_only_true_or_false(field):
    from hat_jax.train.opd_config import OPDConfig
    from hat_jax.train.rl import RLConfig, apply_rl_overrides

    for bad in (None, 0, "false"):
        for make in (RLConfig, lambda **kw: OPDConfig(init="unused", **kw)):
            with pytest.raises(ValueError, match=f"{field} = {bad!r}: expected true or false"):
                make(**{field: bad})
    with pytest.raises(ValueError, match=f"RLConfig.{field} = None"):
        apply_rl_overrides(RLConfig(), [f"{field}=null"])
    assert getattr(apply_rl_overrides(RLConfig(), [f"{field}=false"]), field) is False


@pytest.fixture(scope="module")
def micro():
    config = get_config("micro")
    return config, init_params(config, jax.random.key(0))


@pytest.mark.parametrize("mode,accum", [("token-mean", 1), ("token-mean", 2), ("seq-mean-token-mean", 1),
                                        ("seq-mean-token-sum-norm", 2)])
def test_packed_update_equals_the_unpacked_one(micro, mode, accum):
    config, params = micro
    model = Qwen3_5MoeForCausalLM(config, router_stats=True)
    batch = _batch()
    batch["ref_logprobs"] = (batch["old_logprobs"] - 0.05).astype(np.float32)
    packed = pack_policy_batch(batch, aggregation=mode, max_len=20, rows_multiple=accum)
    assert len(packed["input_ids"]) < len(batch["input_ids"])
    loss_fn = rl_loss_fn(model, aggregation=mode, max_len=20, beta=0.04, mtp=True)
    run = jax.jit(lambda b: accumulate_gradients(loss_fn, params, b, jax.random.key(0), 0.0, 0.1))
    want, want_stats = run(split_micro_batches(batch, 1))
    got, got_stats = run(split_micro_batches(packed, accum))
    np.testing.assert_allclose(float(got_stats["loss"]), float(want_stats["loss"]), rtol=1e-5)
    if accum == 1:  # the MTP loss is a token mean per micro-batch
        np.testing.assert_allclose(float(got_stats["mtp_loss"]), float(want_stats["mtp_loss"]), rtol=1e-5)
    skip = ("mtp",) if accum > 1 else ()
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path({k: v for k, v in got.items() if k not in skip}),
                            jax.tree_util.tree_leaves({k: v for k, v in want.items() if k not in skip})):
        # the MoE load-balancing term is 0 here (lb_coef 0); fp32 sums in another order
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=2e-7,
                                   err_msg=jax.tree_util.keystr(path))


def test_packed_routing_replay_gives_the_unpacked_logprobs(micro):
    config, params = micro
    model = Qwen3_5MoeForCausalLM(config)
    batch = _batch()
    k, rng = config.num_experts_per_tok, np.random.default_rng(3)
    ids = np.stack([np.stack([rng.permutation(config.num_experts)[:k] for _ in range(T)])
                    for _ in range(len(LENGTHS) * config.num_hidden_layers)])
    batch["expert_ids"] = pack_expert_ids(ids.reshape(len(LENGTHS), config.num_hidden_layers, T, k))
    packed = pack_policy_batch(batch, aggregation="token-mean", top_k=k)
    forward = jax.jit(lambda b: policy_forward(model, params, b, 1.0, True)[0])
    want = np.asarray(forward({key: jnp.asarray(v) for key, v in batch.items()}))
    got = np.asarray(forward({key: jnp.asarray(v) for key, v in packed.items()}))
    for row in range(len(packed["input_ids"])):
        for s in range(1, int(packed["segment_ids"][row].max()) + 1):
            span = np.nonzero(packed["segment_ids"][row] == s)[0]
            (i,) = [i for i, n in enumerate(LENGTHS)
                    if n == span.size and np.array_equal(batch["input_ids"][i, :n], packed["input_ids"][row, span])]
            m = batch["action_mask"][i, :span.size] != 0
            np.testing.assert_allclose(got[row, span][m], want[i, :span.size][m], atol=2e-5)


@pytest.mark.parametrize("loss,mode", [("sampled", "token-mean"), ("sampled", "seq-mean-token-mean"),
                                       ("exact", "seq-mean-token-sum-norm")])
def test_packed_opd_update_equals_the_unpacked_one(micro, loss, mode):
    from hat_jax.train.opd_config import OPDConfig
    from hat_jax.train.opd_loss import opd_loss_fn

    config, params = micro
    model = Qwen3_5MoeForCausalLM(config, router_stats=True)
    rng = np.random.default_rng(5)
    batch = _batch()
    del batch["advantages"]
    batch["teacher_logprobs"] = (batch["old_logprobs"] + rng.normal(0.0, 0.3, (len(LENGTHS), T))).astype(np.float32)
    hidden = config.hidden_size
    if loss == "exact":
        batch["teacher_hidden"] = rng.normal(0.0, 1.0, (len(LENGTHS), T, hidden)).astype(np.float32)
    opd = OPDConfig(init="unused", loss=loss, aggregation=mode, mtp_coef=0.1, clip_eps=0.2, max_new_tokens=8,
                    seq_len=T + 1)
    packed = pack_policy_batch(batch, aggregation=mode, max_len=opd.max_len)
    assert len(packed["input_ids"]) < len(batch["input_ids"]) and "attention_mask" not in packed

    def micro_batch(b):
        out = split_micro_batches(b, 1)
        if loss == "exact":
            out["teacher_kernel"] = rng_kernel[None]
        return out

    rng_kernel = jnp.asarray(np.random.default_rng(6).normal(0.0, 0.1, (hidden, config.vocab_size)), jnp.float32)
    run = jax.jit(lambda b: accumulate_gradients(opd_loss_fn(model, opd), params, b, jax.random.key(0), 0.0, 0.1))
    want, want_stats = run(micro_batch(batch))
    got, got_stats = run(micro_batch(packed))
    for key in ("loss", "mtp_loss"):
        np.testing.assert_allclose(float(got_stats[key]), float(want_stats[key]), rtol=1e-5, err_msg=key)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=2e-7,
                                   err_msg=jax.tree_util.keystr(path))
