"""Whole-model behaviour of the micro preset: padding, remat, bf16, MTP, routing replay, the lm_head init."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hat_jax.model import Qwen3_5MoeForCausalLM, get_config, init_params
from hat_jax.model.moe import load_balancing_loss


@pytest.fixture(scope="module")
def micro():
    config = get_config("micro")
    return config, init_params(config, jax.random.key(0))


def _apply(model, params, *args, **kwargs):
    """Jitted apply (eager Flax dispatch is several times slower on CPU)."""
    fn = jax.jit(lambda p, *a: model.apply({"params": p}, *a, **kwargs))
    return fn(params, *args)


def _ids(seed, shape, vocab):
    return jnp.asarray(np.random.RandomState(seed).randint(3, vocab, shape), jnp.int32)


def test_padding_does_not_change_real_tokens(micro):
    config, params = micro
    model = Qwen3_5MoeForCausalLM(config)
    ids = _ids(0, (1, 70), config.vocab_size)
    ref = _apply(model, params, ids).logits[0]
    pad = jnp.zeros((1, 5), jnp.int32)
    mask_left = jnp.concatenate([jnp.zeros((1, 5), bool), jnp.ones((1, 70), bool)], axis=1)
    left = _apply(model, params, jnp.concatenate([pad, ids], 1), mask_left).logits[0, 5:]
    right = _apply(model, params, jnp.concatenate([ids, pad], 1), mask_left[:, ::-1]).logits[0, :70]
    np.testing.assert_allclose(left, ref, atol=2e-5)
    np.testing.assert_allclose(right, ref, atol=2e-5)


def test_remat_gives_the_same_gradients(micro):
    config, params = micro
    ids = _ids(1, (2, 20), config.vocab_size)

    def loss(p, remat):
        out = Qwen3_5MoeForCausalLM(config, remat_policy=remat).apply({"params": p}, ids)
        return jnp.mean(jax.nn.logsumexp(out.logits, -1)) + load_balancing_loss(out.router_logits, 2)

    g0 = jax.jit(jax.grad(lambda p: loss(p, "none")))(params)
    g1 = jax.jit(jax.grad(lambda p: loss(p, "full")))(params)
    for a, b in zip(jax.tree_util.tree_leaves(g0), jax.tree_util.tree_leaves(g1)):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_bfloat16_compute_tracks_float32(micro):
    config, params = micro
    ids = _ids(2, (2, 40), config.vocab_size)
    lp32 = jax.nn.log_softmax(_apply(Qwen3_5MoeForCausalLM(config), params, ids).logits)
    out16 = _apply(Qwen3_5MoeForCausalLM(config, dtype=jnp.bfloat16), params, ids)
    assert out16.logits.dtype == jnp.bfloat16
    lp16 = jax.nn.log_softmax(out16.logits.astype(jnp.float32))
    diff = np.abs(np.asarray(lp16 - lp32))
    assert np.median(diff) < 0.02 and np.percentile(diff, 99) < 0.1


def test_with_mtp_equals_the_mtp_method(micro):
    config, params = micro
    model = Qwen3_5MoeForCausalLM(config)
    ids = _ids(3, (2, 12), config.vocab_size)
    out = _apply(model, params, ids, with_mtp=True)
    next_ids = jnp.concatenate([ids[:, 1:], jnp.zeros((2, 1), jnp.int32)], 1)
    logits, router = model.apply({"params": params}, out.hidden, next_ids, method="mtp_logits")
    np.testing.assert_allclose(out.mtp_logits, logits, atol=1e-6)
    assert out.mtp_logits.shape == (2, 12, config.vocab_size) and router.shape == (1, 24, config.num_experts)


def test_routing_replay_with_recorded_ids_reproduces_the_forward(micro):
    config, params = micro
    model = Qwen3_5MoeForCausalLM(config)
    ids = _ids(4, (2, 16), config.vocab_size)
    out = _apply(model, params, ids)
    assert out.expert_ids.shape == (config.num_hidden_layers, 32, config.num_experts_per_tok)
    replay = _apply(model, params, ids, None, None, None, out.expert_ids)
    np.testing.assert_array_equal(replay.logits, out.logits)
    other = _apply(model, params, ids, None, None, None, (out.expert_ids + 1) % config.num_experts)
    assert not np.allclose(other.logits, out.logits)


def test_mtp_free_config_has_no_mtp_params():
    config = get_config("micro", mtp_num_hidden_layers=0)
    params = init_params(config, jax.random.key(0))
    assert "mtp" not in params
    with pytest.raises(ValueError, match="no MTP block"):
        Qwen3_5MoeForCausalLM(config).apply({"params": params}, jnp.zeros((1, 2, 64)), jnp.zeros((1, 2), jnp.int32),
                                            method="mtp_logits")


def test_an_lm_head_started_from_the_embedding_scores_each_token_highest_for_itself(micro):
    config, normal = micro
    tied = init_params(config, jax.random.key(0), lm_head_init="embedding")
    embedding, kernel = tied["model"]["embed_tokens"]["embedding"], tied["lm_head"]["kernel"]
    assert kernel.shape == (config.hidden_size, config.vocab_size)
    np.testing.assert_array_equal(kernel, embedding.T)
    # the rest of the init is unchanged: same draws for every other parameter
    rest = lambda p: {k: v for k, v in p.items() if k != "lm_head"}
    jax.tree_util.tree_map(np.testing.assert_array_equal, rest(tied), rest(normal))
    # an embedding read back through the lm_head scores its own token highest; transformers' init does not
    ids = np.arange(config.vocab_size)
    assert (np.argmax(embedding @ kernel, -1) == ids).all()
    assert (np.argmax(embedding @ normal["lm_head"]["kernel"], -1) == ids).mean() < 0.05
    with pytest.raises(ValueError, match=r"init_params: lm_head_init = 'tied'; expected one of \('normal', 'embedding'\)"):
        init_params(config, jax.random.key(0), lm_head_init="tied")
