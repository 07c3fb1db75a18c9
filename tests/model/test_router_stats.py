"""The router sums (`hat_jax.model.router_stats`): a hand case, and the model's in-layer sums
(`router_stats=True`) against the logits path: same lb loss, z-loss, expert load CV and gradients w.r.t. every
parameter, with padding and packed rows, for the Python layer loop and the scan (fp32, micro)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hat_jax.model import Qwen3_5MoeForCausalLM, get_config, init_params
from hat_jax.model.moe import load_balancing_loss, router_z_loss
from hat_jax.model.router_stats import (expert_load_cv, load_balancing_loss_from_stats, router_stats,
                                        router_z_loss_from_stats)
from hat_jax.train.sft import sft_loss_fn
from hat_jax.train.trainer import accumulate_gradients, moe_aux, output_router_stats, split_micro_batches


def test_hand_case():
    # one layer, 3 tokens, 2 experts, top-1; token 2 is padding. Token 0 -> expert 0 (p = 0.5, 0.5 ties to 0),
    # token 1 -> expert 1 with p = (1/(1+e), e/(1+e)).
    logits = jnp.asarray([[[0.0, 0.0], [0.0, 1.0], [5.0, 0.0]]])
    mask = jnp.asarray([1, 1, 0])
    s = router_stats(logits, 1, mask)
    p1 = 1 / (1 + math.e)
    np.testing.assert_array_equal(s.counts, [[1.0, 1.0]])
    np.testing.assert_allclose(s.prob_sums, [[0.5 + p1, 0.5 + 1 - p1]], rtol=1e-6)
    np.testing.assert_allclose(s.lse_sq_sum, [math.log(2) ** 2 + math.log(1 + math.e) ** 2], rtol=1e-6)
    np.testing.assert_array_equal(s.tokens, [2.0])
    # lb = E * sum_e (1/2) * prob_sums_e / 2 = 2 * (1/4) * 2 = 1; cv of counts (1, 1) = 0
    np.testing.assert_allclose(load_balancing_loss_from_stats(s), 1.0, rtol=1e-6)
    np.testing.assert_allclose(load_balancing_loss_from_stats(s), load_balancing_loss(logits, 1, mask), rtol=1e-6)
    np.testing.assert_allclose(router_z_loss_from_stats(s), router_z_loss(logits, mask), rtol=1e-6)
    assert float(expert_load_cv(s)) == 0.0


def test_layers_pool_like_the_reference():
    r = np.random.RandomState(0)
    logits = jnp.asarray(r.randn(3, 10, 8), jnp.float32)
    mask = jnp.asarray(r.rand(10) > 0.3)
    per_layer = [router_stats(logits[i], 2, mask) for i in range(3)]
    stacked = jax.tree_util.tree_map(lambda *a: jnp.stack(a), *per_layer)
    np.testing.assert_allclose(load_balancing_loss_from_stats(stacked), load_balancing_loss(logits, 2, mask),
                               rtol=1e-6)
    np.testing.assert_allclose(router_z_loss_from_stats(stacked), router_z_loss(logits, mask), rtol=1e-6)
    assert float(jnp.sum(stacked.counts)) == 3 * 2 * int(mask.sum())


@pytest.fixture(scope="module")
def micro():
    config = get_config("micro")
    return config, init_params(config, jax.random.key(0))


def _inputs(config, packed):
    b, t = 2, 20
    ids = jnp.asarray(np.random.RandomState(1).randint(3, config.vocab_size, (b, t)), jnp.int32)
    if packed:
        seg = jnp.asarray([[1] * 7 + [2] * 9 + [0] * 4, [1] * 12 + [2] * 8], jnp.int32)
        return ids, {"segment_ids": seg}, seg > 0
    mask = jnp.asarray([[1] * t, [1] * 13 + [0] * 7], jnp.int32)
    return ids, {"attention_mask": mask}, mask


def _aux_and_grads(model, params, ids, kwargs, token_mask):
    """([lb, z, cv], d[lb, z]/d params) of one forward; the logits path through the reference functions."""
    k = model.config.num_experts_per_tok

    def losses(p):
        out = model.apply({"params": p}, ids, **kwargs)
        if model.router_stats:
            assert out.router_logits is None
            s = out.router_stats
            lb, z = load_balancing_loss_from_stats(s), router_z_loss_from_stats(s)
        else:
            mask = token_mask.reshape(-1)
            lb, z = load_balancing_loss(out.router_logits, k, mask), router_z_loss(out.router_logits, mask)
        cv = moe_aux(output_router_stats(out, token_mask, k))["moe/expert_load_cv"]
        vals = jnp.stack([lb, z])
        return vals, (vals, cv)

    jac, (vals, cv) = jax.jit(jax.jacrev(losses, has_aux=True))(params)
    return np.append(vals, cv), jac


@pytest.mark.parametrize("scan,remat,packed", [(False, "none", False), (True, "full", True)],
                         ids=["loop-padded", "scan-remat-packed"])
def test_in_layer_sums_equal_the_logits_path(micro, scan, remat, packed):
    config, params = micro
    ids, kwargs, token_mask = _inputs(config, packed)
    opts = dict(scan_layers=scan, remat_policy=remat)
    ref_vals, ref_jac = _aux_and_grads(Qwen3_5MoeForCausalLM(config, **opts), params, ids, kwargs, token_mask)
    vals, jac = _aux_and_grads(Qwen3_5MoeForCausalLM(config, router_stats=True, **opts), params, ids, kwargs,
                               token_mask)
    np.testing.assert_allclose(vals, ref_vals, rtol=1e-6, atol=0)
    assert ref_vals[0] > 1.0 and ref_vals[1] > 0.0  # real losses (the lb loss's balanced value is k = 2)
    nonzero = 0
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(jac), jax.tree_util.tree_leaves(ref_jac)):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0, err_msg=jax.tree_util.keystr(path))
        nonzero += bool(np.any(np.asarray(b) != 0))
    assert nonzero > 10  # the router and everything below it get gradients


def test_sft_step_gradients_equal_with_router_stats(micro):
    """The SFT loss function (padding excluded, lb_coef > 0) on packed rows: the same stats and gradients
    from a model with in-layer sums as from one returning logits."""
    config, params = micro
    ids, kwargs, _ = _inputs(config, packed=True)
    batch = {"input_ids": ids, "segment_ids": kwargs["segment_ids"], "loss_mask": (kwargs["segment_ids"] > 0).astype(jnp.int32)}
    batch = split_micro_batches(jax.device_get(batch), 2)
    out = {}
    for flag in (False, True):
        loss_fn = sft_loss_fn(Qwen3_5MoeForCausalLM(config, scan_layers=True, router_stats=flag))
        out[flag] = jax.jit(lambda p, b: accumulate_gradients(loss_fn, p, b, jax.random.key(0), 0.5))(params, batch)
    (g_ref, s_ref), (g, s) = out[False], out[True]
    for key in ("loss", "lb_loss", "total_loss", "moe/expert_load_cv"):
        np.testing.assert_allclose(s[key], s_ref[key], rtol=1e-6, err_msg=key)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g), jax.tree_util.tree_leaves(g_ref)):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0, err_msg=jax.tree_util.keystr(path))


def test_output_shapes(micro):
    config, params = micro
    ids, kwargs, _ = _inputs(config, packed=False)
    out = jax.jit(lambda p: Qwen3_5MoeForCausalLM(config, router_stats=True).apply({"params": p}, ids, **kwargs))(
        params)
    n_layers, e, k = config.num_hidden_layers, config.num_experts, config.num_experts_per_tok
    s = out.router_stats
    assert out.router_logits is None and out.expert_ids.shape == (n_layers, ids.size, k)
    assert s.counts.shape == s.prob_sums.shape == (n_layers, e) and s.lse_sq_sum.shape == s.tokens.shape == (n_layers,)
    np.testing.assert_array_equal(s.tokens, 33.0)  # 20 + 13 real tokens
    np.testing.assert_array_equal(jnp.sum(s.counts, -1), 33.0 * k)
