"""The scan over layer blocks and the remat policies give the Python loop's forward and gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hat_jax.model import Qwen3_5MoeForCausalLM, get_config, init_params
from hat_jax.model.moe import load_balancing_loss
from hat_jax.model.transformer import REMAT_POLICIES, check_remat_policy, layer_block


@pytest.fixture(scope="module")
def micro():
    config = get_config("micro")  # 4 layers = one block of 3 Gated DeltaNet + 1 attention
    return config, init_params(config, jax.random.key(0))


@pytest.fixture(scope="module")
def micro3():
    # 3 layers at an attention interval of 2: one block [DeltaNet, attention] and a partial block [DeltaNet]
    config = get_config("micro", num_hidden_layers=3, full_attention_interval=2)
    return config, init_params(config, jax.random.key(1))


def _ids(seed, shape, vocab):
    return jnp.asarray(np.random.RandomState(seed).randint(3, vocab, shape), jnp.int32)


def _outputs_and_grads(config, params, ids, scan, policy, **kwargs):
    model = Qwen3_5MoeForCausalLM(config, scan_layers=scan, remat_policy=policy)

    def loss(p):
        out = model.apply({"params": p}, ids, **kwargs)
        lse = jax.nn.logsumexp(out.logits, -1)
        return jnp.mean(lse) + load_balancing_loss(out.router_logits, config.num_experts_per_tok), out

    (value, out), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    return value, out, grads


def _assert_same(a, b, atol):
    va, oa, ga = a
    vb, ob, gb = b
    np.testing.assert_allclose(va, vb, atol=atol, rtol=0)
    np.testing.assert_allclose(oa.logits, ob.logits, atol=atol, rtol=0)
    np.testing.assert_allclose(oa.router_logits, ob.router_logits, atol=atol, rtol=0)
    np.testing.assert_array_equal(oa.expert_ids, ob.expert_ids)
    flat_a, flat_b = jax.tree_util.tree_leaves_with_path(ga), jax.tree_util.tree_leaves(gb)
    for (path, x), y in zip(flat_a, flat_b):
        np.testing.assert_allclose(x, y, atol=atol, rtol=0, err_msg=jax.tree_util.keystr(path))


def test_layer_block_is_the_pattern_period():
    assert layer_block(get_config("qwen3_6_35b_a3b").layer_types) == 4
    assert layer_block(("a", "a", "a")) == 1 and layer_block(("a", "b", "a")) == 2 and layer_block(()) == 1


@pytest.fixture(scope="module")
def loop3(micro3):
    config, params = micro3
    ids = _ids(0, (2, 24), config.vocab_size)
    return ids, _outputs_and_grads(config, params, ids, False, "none")


@pytest.mark.parametrize("policy", ["none", "full"])
def test_scan_equals_the_loop(micro3, loop3, policy):
    config, params = micro3
    ids, ref = loop3
    _assert_same(_outputs_and_grads(config, params, ids, True, policy), ref, 1e-6)
    assert ref[1].router_logits.shape == (3, 48, config.num_experts)


def test_scan_with_packed_segments_and_routing_replay(micro):
    config, params = micro
    ids = _ids(1, (2, 20), config.vocab_size)
    seg = jnp.asarray([[1] * 7 + [2] * 9 + [0] * 4, [1] * 12 + [2] * 8], jnp.int32)
    forced = jax.random.randint(jax.random.key(2), (4, 40, config.num_experts_per_tok), 0, config.num_experts)
    kwargs = dict(segment_ids=seg, forced_expert_ids=forced)
    ref = _outputs_and_grads(config, params, ids, False, "none", **kwargs)
    np.testing.assert_array_equal(ref[1].expert_ids, forced)
    _assert_same(_outputs_and_grads(config, params, ids, True, "save_layer_outputs", **kwargs), ref, 1e-6)


def test_scan_keeps_the_cached_decode_on_the_loop(micro):
    from hat_jax.model.cache import init_cache
    config, params = micro
    ids = _ids(4, (1, 8), config.vocab_size)
    outs = []
    for scan in (False, True):
        model = Qwen3_5MoeForCausalLM(config, scan_layers=scan)
        cache = init_cache(config, 1, 16)
        outs.append(jax.jit(lambda p, i, c: model.apply({"params": p}, i, cache=c))(params, ids, cache).logits)
    np.testing.assert_array_equal(outs[0], outs[1])


def test_unknown_remat_policy_lists_the_valid_ones(micro):
    config, params = micro
    with pytest.raises(ValueError, match="remat_policy = 'dots'.*dots_saveable"):
        Qwen3_5MoeForCausalLM(config, remat_policy="dots").apply({"params": params}, _ids(5, (1, 4), 512))
    with pytest.raises(ValueError, match="sft.remat_policy"):
        check_remat_policy("x", "sft.remat_policy")
    assert "none" in REMAT_POLICIES and "full" in REMAT_POLICIES


def test_scan_in_bf16_stacks_the_matrices_in_bf16_and_keeps_the_loops_values():
    # two blocks [DeltaNet, attention]: each parameter stacked twice
    config = get_config("micro", num_hidden_layers=4, full_attention_interval=2)
    params = init_params(config, jax.random.key(3))
    ids = _ids(2, (2, 16), config.vocab_size)

    def model(scan):
        return Qwen3_5MoeForCausalLM(config, dtype=jnp.bfloat16, scan_layers=scan, remat_policy="none")

    def run(scan):
        def loss(p):
            out = model(scan).apply({"params": p}, ids)
            return jnp.mean(jax.nn.logsumexp(out.logits.astype(jnp.float32), -1)), out.logits

        return jax.jit(jax.value_and_grad(loss, has_aux=True))(params)

    jaxpr = jax.make_jaxpr(lambda p: model(True).apply({"params": p}, ids).logits)(params).jaxpr
    (scan_eqn,) = [e for e in jaxpr.eqns if e.primitive.name == "scan"]
    stacked = [v.aval for v in scan_eqn.invars[scan_eqn.params["num_consts"] + scan_eqn.params["num_carry"]:]]
    assert {a.dtype for a in stacked if a.ndim >= 3} == {jnp.dtype(jnp.bfloat16)}   # the kernels' [2, ...] copies
    assert {a.dtype for a in stacked if a.ndim == 2} == {jnp.dtype(jnp.float32)}    # norm weights, A_log, dt_bias

    (value_scan, logits_scan), grads_scan = run(True)
    (value_loop, logits_loop), grads_loop = run(False)
    # bf16 rounding differs between the two programs' fusions (as it did before the cast moved to the stack)
    np.testing.assert_allclose(np.asarray(logits_scan, np.float32), np.asarray(logits_loop, np.float32), atol=8e-3)
    np.testing.assert_allclose(float(value_scan), float(value_loop), atol=1e-4)
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(grads_scan), jax.tree_util.tree_leaves(grads_loop)):
        assert x.dtype == y.dtype == jnp.float32, jax.tree_util.keystr(path)   # gradients in the params' dtype
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=5e-4, err_msg=jax.tree_util.keystr(path))
