"""The offline MTP acceptance (`hat_jax.eval.mtp_acceptance`, experiments/benchmarks/mtp_acceptance.py): the depth-1
accounting on a hand case, and the benchmark end to end on a freshly initialised micro checkpoint, its figures
equal to a direct per-episode count."""

import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hat_jax.eval.mtp_acceptance import (checkpoint_acceptance, depth1_acceptance, greedy_tokens_chunked,
                                         live_qa_oracle_episodes, make_acceptance_fn)
from hat_jax.model import Qwen3_5MoeForCausalLM, get_config, init_params

BENCHMARKS = Path(__file__).resolve().parents[2] / "experiments" / "benchmarks"


def _one_hot(ids, v=4):
    return jnp.asarray(np.eye(v, dtype=np.float32)[np.asarray(ids)])[None]


def test_depth1_acceptance_hand_case():
    ids = jnp.array([[3, 1, 2, 2, 0, 1]])
    greedy = [1, 2, 2, 3, 1, 0]      # g_s, the main model's choice of token s+1
    draft = [2, 2, 3, 1, 0, 0]       # d_s, the draft of token s+2
    mask = jnp.array([[0, 1, 1, 1, 1, 0]])
    got = jax.device_get(depth1_acceptance(_one_hot(greedy), _one_hot(draft), ids, mask))
    # counted t: mask[t+1] and mask[t+2] -> t = 0, 1, 2; d_t vs g_{t+1}: (2, 2) yes, (2, 2) yes, (3, 3) yes
    # d_t vs x_{t+2}: (2, 2) yes, (2, 2) yes, (3, 0) no; g_{t+1} vs x_{t+2}: (2, 2), (2, 2), (3, 0)
    assert got == {"positions": 3.0, "accepted": 3.0, "main_correct": 2.0, "draft_correct": 2.0}
    draft[1] = 0
    got = jax.device_get(depth1_acceptance(_one_hot(greedy), _one_hot(draft), ids, mask))
    assert got["accepted"] == 2.0
    # packed rows: position 1 predicts across a document boundary at 3
    seg = jnp.array([[1, 1, 1, 2, 2, 2]])
    got = jax.device_get(depth1_acceptance(_one_hot(greedy), _one_hot(draft), ids, mask, seg))
    assert got["positions"] == 1.0  # t = 0 only (t = 1, 2 reach into document 2)


def test_benchmark_end_to_end_on_a_fresh_micro_checkpoint(tmp_path, monkeypatch):
    from hat_jax.data.world_data import WorldDataConfig
    from hat_jax.model.checkpoint_io import save_model_checkpoint
    from hat_jax.tokenizer import load_tokenizer
    from hat_jax.train.sft import bpe_tokenizer_dir

    monkeypatch.setenv("HAT_JAX_CACHE", str(tmp_path / "cache"))
    config = get_config("micro", vocab_size=4096)  # tiny's vocabulary: the production prompt is ~930 tokens
    params = init_params(config, jax.random.key(0))
    ckpt = tmp_path / "run"
    save_model_checkpoint(ckpt / "model", params, config)
    tok_dir = bpe_tokenizer_dir(4096, 8, WorldDataConfig(sft_tasks=8, rl_tasks=0, eval_items=0))
    (ckpt / "tokenizer").mkdir()
    for f in tok_dir.iterdir():
        (ckpt / "tokenizer" / f.name).write_bytes(f.read_bytes())

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    sys.modules.pop("mtp_acceptance", None)
    import mtp_acceptance

    out = tmp_path / "acc.json"
    report = mtp_acceptance.main(["--ckpt", str(ckpt / "model"), "--items", "2", "--max-len", "1536", "--batch", "2",
                                  "--depth", "1", "--sft-tasks", "8", "--rl-tasks", "0", "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert report["episodes"] >= 1 and report["positions"] > 0
    (row,) = report["depths"]
    assert row["depth"] == 1 and 0.0 <= row["acceptance"] <= 1.0
    assert report["mean_accepted_length"] == pytest.approx(1.0 + row["acceptance"])

    # the same figures counted directly, one unpadded episode at a time
    episodes = live_qa_oracle_episodes(load_tokenizer(ckpt / "tokenizer"), WorldDataConfig(sft_tasks=8, rl_tasks=0, eval_items=2),
                                       1536)
    model = Qwen3_5MoeForCausalLM(config)
    forward = jax.jit(lambda p, x: model.apply({"params": p}, x, with_mtp=True))
    positions = accepted = 0
    for ids, mask in episodes:
        o = forward(params, jnp.asarray(ids)[None])
        g, d = np.argmax(np.asarray(o.logits[0]), -1), np.argmax(np.asarray(o.mtp_logits[0]), -1)
        for t in range(len(ids) - 2):
            if mask[t + 1] and mask[t + 2]:
                positions += 1
                accepted += int(d[t] == g[t + 1])
    assert report["episodes"] == len(episodes) and report["positions"] == positions
    assert row["acceptance"] == pytest.approx(accepted / positions, abs=1e-9)


def test_checkpoint_acceptance_names_a_bad_count():
    from hat_jax.data.world_data import WorldDataConfig

    with pytest.raises(ValueError, match=r"checkpoint_acceptance: items = -2; expected an int >= 1"):
        checkpoint_acceptance(None, None, None, WorldDataConfig(), items=-2, max_len=64)
    with pytest.raises(ValueError, match=r"checkpoint_acceptance: max_len = 2; expected an int >= 3"):
        checkpoint_acceptance(None, None, None, WorldDataConfig(), items=1, max_len=2)


@pytest.mark.parametrize("chunk", [1, 3, 5, 11, 64])
def test_chunked_greedy_tokens_equal_the_full_argmax_ties_included(chunk):
    h = jax.random.normal(jax.random.key(1), (2, 7, 6))
    kernel = jax.random.normal(jax.random.key(2), (6, 11))
    kernel = kernel.at[:, 10].set(kernel[:, 4])  # tied columns across chunk borders
    big = jnp.zeros(6).at[0].set(10.0)
    kernel = kernel.at[:, 2].set(big).at[:, 9].set(big)
    h = h.at[0, 0].set(jnp.zeros(6).at[0].set(1.0))  # logits 10 at columns 2 and 9, |N(0, 1)| elsewhere
    full = jnp.argmax(jnp.einsum("bth,hv->btv", h, kernel), -1)
    got = greedy_tokens_chunked(h, kernel, chunk)
    assert got.dtype == jnp.int32 and int(full[0, 0]) == 2
    np.testing.assert_array_equal(np.asarray(got), np.asarray(full))
    with pytest.raises(ValueError, match="chunk = 0; expected >= 1"):
        greedy_tokens_chunked(h, kernel, 0)


def test_acceptance_over_vocabulary_chunks_equals_the_full_logits():
    config = get_config("micro")
    params = init_params(config, jax.random.key(0))
    model = Qwen3_5MoeForCausalLM(config)
    ids = jax.random.randint(jax.random.key(3), (2, 24), 0, config.vocab_size)
    att = jnp.ones((2, 24), jnp.int32).at[1, 20:].set(0)
    loss = jnp.ones((2, 24), jnp.int32).at[:, :4].set(0)
    full = jax.device_get(make_acceptance_fn(model)(params, ids, att, loss))
    chunked = jax.device_get(make_acceptance_fn(model, vocab_chunk=100)(params, ids, att, loss))
    assert full["positions"] == 34.0 and chunked == full


def test_chain_acceptance_hand_case():
    from hat_jax.eval.mtp_acceptance import chain_acceptance

    greedy = jnp.array([[5, 1, 2, 3, 4, 6, 7]])           # g_s: the main model's token s+1
    drafts = jnp.array([[[2, 3, 4], [2, 3, 9], [3, 9, 9], [9, 6, 7], [6, 7, 0], [7, 0, 0], [0, 0, 0]]])
    mask = jnp.array([[0, 1, 1, 1, 1, 1, 1]])
    got = jax.device_get(chain_acceptance(greedy, drafts, mask))
    # counted t (tokens t+1, t+2 generated): 0..4. t=0: d^1..d^3 = 2,3,4 vs g_1..g_3 = 1,2,3 -> none.
    # t=1: 2,3,9 vs g_2..g_4 = 2,3,4 -> depths 1, 2. t=2: 3,9 vs 3,4 -> depth 1. t=3: 9 vs 4 -> none.
    # t=4: d^1 = 6 = g_5 (token 6 generated) -> depth 1; d^2 = 7 = g_6 guesses token 7, past the row -> no.
    assert float(got["positions"]) == 5.0
    assert got["accepted"].tolist() == [3.0, 1.0, 0.0]


def test_chain_drafts_equal_the_samplers_sequential_drafting():
    """Every position's d^1..d^3 from the batched chain equal `_draft_chain` (the sampler's drafting) run from an
    MTP cache whose valid slots are that position's prefix (later slots invalid, as rejected drafts are), on a
    micro model with every weight perturbed."""
    from hat_jax.eval.mtp_acceptance import make_chain_fn
    from hat_jax.model.sampling import SamplingConfig, _Sampling
    from hat_jax.model.speculative import _draft_chain, mtp_cached, init_mtp_cache

    config = get_config("micro")
    params = init_params(config, jax.random.key(0))
    leaves, tree = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    params = jax.tree_util.tree_unflatten(tree, [a + 0.05 * jax.random.normal(k, a.shape, a.dtype)
                                                 for a, k in zip(leaves, keys)])
    model = Qwen3_5MoeForCausalLM(config)
    t = 12
    ids = jax.random.randint(jax.random.key(2), (1, t), 3, config.vocab_size)
    att = jnp.ones((1, t), jnp.int32)
    greedy, drafts = make_chain_fn(model, 3, chain_rows=5)(params, ids, att)
    out = model.apply({"params": params}, ids, attention_mask=att, return_logits=True)
    assert jnp.array_equal(greedy, jnp.argmax(out.logits, -1))
    mtp = lambda h, x, m, c: model.apply({"params": params}, h, x, m, c, method=mtp_cached)
    lm_head = lambda h: model.apply({"params": params}, h, method=lambda m, h: m.lm_head(h))
    s = _Sampling.from_config(SamplingConfig(temperature=0.0, max_new_tokens=4))
    next_ids = jnp.pad(ids[:, 1:], ((0, 0), (0, 1)))

    @jax.jit
    def sequential(pos):
        cache = {**init_mtp_cache(config, 1, t + 2), "index": 0}
        prefix = (jnp.arange(t) <= pos)[None]
        hidden, cache = mtp(out.hidden, next_ids, prefix, cache)
        return _draft_chain(mtp, lm_head, hidden[:, pos], jnp.ones((1,), bool), cache, jax.random.key(0), 0, s, 3)[0]

    want = [sequential(pos)[0].tolist() for pos in range(t - 1)]
    assert [drafts[0, pos].tolist() for pos in range(t - 1)] == want
    assert len({tuple(w) for w in want}) > 3   # the drafts vary with the position: not a comparison of constants


def test_deeper_report_keeps_the_depth1_figures():
    config = get_config("micro")
    params = init_params(config, jax.random.key(0))
    model = Qwen3_5MoeForCausalLM(config)
    rng = np.random.default_rng(0)
    episodes = [(rng.integers(3, config.vocab_size, n).astype(np.int32),
                 (np.arange(n) >= 4).astype(np.int32)) for n in (20, 27, 9)]
    from hat_jax.eval.mtp_acceptance import acceptance_report
    one = acceptance_report(model, params, episodes, batch_size=2, bucket=8)
    three = acceptance_report(model, params, episodes, batch_size=2, bucket=8, depth=3, chain_rows=7)
    assert three["positions"] == one["positions"] > 0 and three["speculative_tokens"] == 3
    assert three["depths"][0] == one["depths"][0]
    assert three["main_greedy_matches_data"] == one["main_greedy_matches_data"]
    per = [d["per_position_acceptance"] for d in three["depths"]]
    assert per == sorted(per, reverse=True)
    assert three["mean_accepted_length"] == pytest.approx(1.0 + sum(per))


def test_padded_batches_refuses_a_bad_bucket_or_batch_size():
    from hat_jax.eval.mtp_acceptance import padded_batches

    episodes = [(np.arange(5, dtype=np.int32), np.ones(5, np.int32))]
    with pytest.raises(ValueError, match=r"padded_batches: bucket = 0; expected an int >= 1"):
        list(padded_batches(episodes, 2, 0, 0))
    with pytest.raises(ValueError, match=r"padded_batches: batch_size = -1; expected an int >= 1"):
        list(padded_batches(episodes, -1, 8, 0))
