"""Hand-checked cases for the model's layers and losses."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from moe_helpers import expert_grads, expert_inputs

from hat_jax.model.attention_impls import gqa_attention
from hat_jax.model.deltanet import (causal_depthwise_conv, chunk_gated_delta_rule, l2_normalize,
                                    recurrent_gated_delta_rule)
from hat_jax.model.moe import (blocked_expert_ffn, load_balancing_loss, ragged_expert_ffn, route,
                               router_z_loss)
from hat_jax.model.norms import gated_rms_norm, rms_norm
from hat_jax.model.rope import apply_partial_rope, rope_cos_sin
from hat_jax.model.transformer import mtp_loss


def test_rms_norm_is_zero_centred():
    x = jnp.array([[3.0, 4.0]])
    y = rms_norm(x, jnp.array([0.0, 1.0]), eps=0.0)
    r = math.sqrt(12.5)
    np.testing.assert_allclose(y, [[3 / r, 2 * 4 / r]], rtol=1e-6)


def test_gated_rms_norm_plain_weight_and_silu_gate():
    x = jnp.array([[3.0, 4.0]])
    gate = jnp.array([[0.0, 2.0]])
    y = gated_rms_norm(x, gate, jnp.array([2.0, 1.0]), eps=0.0)
    r = math.sqrt(12.5)
    silu2 = 2.0 / (1.0 + math.exp(-2.0))
    np.testing.assert_allclose(y, [[0.0, 4 / r * silu2]], rtol=1e-6)


def test_partial_rope_rotates_only_the_first_dims():
    # head_dim 4, rotary_dim 2 -> inv_freq = [1]; position p rotates (x0, x1) by angle p
    cos, sin = rope_cos_sin(jnp.array([[0, 2]]), rotary_dim=2, theta=10_000.0)
    x = jnp.array([1.0, 2.0, 3.0, 4.0]).reshape(1, 1, 1, 4).repeat(2, axis=1)
    y = apply_partial_rope(x, cos, sin)
    np.testing.assert_allclose(y[0, 0, 0], [1, 2, 3, 4], rtol=1e-6)
    c, s = math.cos(2.0), math.sin(2.0)
    np.testing.assert_allclose(y[0, 1, 0], [1 * c - 2 * s, 2 * c + 1 * s, 3, 4], rtol=1e-6)


def test_rope_frequencies_neox_layout():
    cos, _ = rope_cos_sin(jnp.array([[1]]), rotary_dim=4, theta=100.0)
    # inv_freq = 1 / 100^([0, 2] / 4) = [1, 0.1]; table = cat(freqs, freqs)
    np.testing.assert_allclose(cos[0, 0], np.cos([1.0, 0.1, 1.0, 0.1]), rtol=1e-6)


def test_gqa_attention_matches_repeat_kv_reference():
    r = np.random.RandomState(0)
    b, t, h, kv, d = 2, 5, 4, 2, 8
    q, k, v = r.randn(b, t, h, d), r.randn(b, t, kv, d), r.randn(b, t, kv, d)
    mask = np.tril(np.ones((t, t), bool))[None].repeat(b, 0)
    mask[1, :, 0] = False  # a padded first key in row 1
    out = gqa_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), jnp.asarray(mask), d**-0.5)
    ref = np.zeros_like(q)
    for bi in range(b):
        for hi in range(h):
            kh = hi // (h // kv)  # query head h uses KV head h // group
            s = q[bi, :, hi] @ k[bi, :, kh].T * d**-0.5
            s = np.where(mask[bi], s, -1e30)
            p = np.exp(s - s.max(-1, keepdims=True))
            p = np.where(mask[bi], p, 0)
            p /= np.maximum(p.sum(-1, keepdims=True), 1e-30)
            ref[bi, :, hi] = p @ v[bi, :, kh]
    ref[1, 0] = out[1, 0]  # fully masked row: any finite value
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, ref, atol=1e-5)


def test_causal_depthwise_conv_hand_case():
    x = jnp.array([[[1.0], [2.0], [3.0]]])                 # [B=1, T=3, C=1]
    kernel = jnp.array([[10.0], [1.0]])                    # K=2: y[t] = 10 x[t-1] + x[t]
    y, state = causal_depthwise_conv(x, kernel, jnp.zeros((1, 1, 1)))
    np.testing.assert_allclose(y[0, :, 0], [1, 12, 23])
    np.testing.assert_allclose(state[0, :, 0], [3])
    y2, _ = causal_depthwise_conv(jnp.array([[[4.0]]]), kernel, state)   # continues from the state
    np.testing.assert_allclose(y2[0, :, 0], [34])


def _delta_inputs(seed, b, t, h, dk, dv):
    r = np.random.RandomState(seed)
    q = l2_normalize(jnp.asarray(r.randn(b, t, h, dk), jnp.float32)) * dk**-0.5
    k = l2_normalize(jnp.asarray(r.randn(b, t, h, dk), jnp.float32))
    v = jnp.asarray(r.randn(b, t, h, dv), jnp.float32)
    g = jnp.asarray(-np.abs(r.randn(b, t, h)) * 0.5, jnp.float32)
    beta = jax.nn.sigmoid(jnp.asarray(r.randn(b, t, h), jnp.float32))
    s0 = jnp.asarray(r.randn(b, h, dk, dv) * 0.1, jnp.float32)
    return q, k, v, g, beta, s0


@pytest.mark.parametrize("t", [1, 63, 64, 65, 130])
def test_chunked_delta_rule_equals_recurrent(t):
    args = _delta_inputs(t, 2, t, 3, 8, 6)
    o_c, s_c = chunk_gated_delta_rule(*args)
    o_r, s_r = recurrent_gated_delta_rule(*args)
    np.testing.assert_allclose(o_c, o_r, atol=2e-6)
    np.testing.assert_allclose(s_c, s_r, atol=2e-6)


def test_delta_rule_single_step_by_hand():
    # one head, Dk = Dv = 2, S0 = 0: S1 = k (beta v)^T, o = S1^T q
    q = jnp.array([1.0, 0.0]).reshape(1, 1, 1, 2)
    k = jnp.array([0.6, 0.8]).reshape(1, 1, 1, 2)
    v = jnp.array([2.0, -1.0]).reshape(1, 1, 1, 2)
    g = jnp.zeros((1, 1, 1))
    beta = jnp.full((1, 1, 1), 0.5)
    o, s = recurrent_gated_delta_rule(q, k, v, g, beta, jnp.zeros((1, 1, 2, 2)))
    np.testing.assert_allclose(s[0, 0], np.outer([0.6, 0.8], [1.0, -0.5]), rtol=1e-6)
    np.testing.assert_allclose(o[0, 0, 0], [0.6, -0.3], rtol=1e-6)


def test_route_renormalises_top_k():
    logits = jnp.log(jnp.array([[0.1, 0.2, 0.3, 0.4]]))
    w, ids = route(logits, 2)
    np.testing.assert_array_equal(ids, [[3, 2]])
    np.testing.assert_allclose(w, [[0.4 / 0.7, 0.3 / 0.7]], rtol=1e-6)
    # routing replay: forced ids take their live probabilities, renormalised
    w2, ids2 = route(logits, 2, forced_expert_ids=jnp.array([[0, 1]]))
    np.testing.assert_array_equal(ids2, [[0, 1]])
    np.testing.assert_allclose(w2, [[1 / 3, 2 / 3]], rtol=1e-6)


def _expert_reference(x, ids, gate_up, down):
    x, ids, gate_up, down = map(np.asarray, (x, ids, gate_up, down))
    i = down.shape[1]
    out = np.zeros(ids.shape + (x.shape[1],), np.float64)
    for n in range(ids.shape[0]):
        for j in range(ids.shape[1]):
            e = ids[n, j]
            h = x[n] @ gate_up[e]
            g, u = h[:i], h[i:]
            out[n, j] = (g / (1 + np.exp(-g)) * u) @ down[e]
    return out


@pytest.mark.parametrize("n,e,k", [(1, 16, 4), (7, 4, 2), (300, 8, 2)])
@pytest.mark.parametrize("impl", [blocked_expert_ffn, ragged_expert_ffn])
def test_expert_dispatch_matches_per_token_loop(n, e, k, impl):
    r = np.random.RandomState(n + e)
    h, i = 6, 5
    x = jnp.asarray(r.randn(n, h), jnp.float32)
    ids = jnp.asarray(np.stack([r.choice(e, k, replace=False) for _ in range(n)]), jnp.int32)
    gate_up = jnp.asarray(r.randn(e, h, 2 * i) * 0.3, jnp.float32)
    down = jnp.asarray(r.randn(e, i, h) * 0.3, jnp.float32)
    np.testing.assert_allclose(impl(x, ids, gate_up, down), _expert_reference(x, ids, gate_up, down), atol=1e-5)


def test_blocked_dispatch_gradients_match_ragged():
    inputs = expert_inputs(np.random.RandomState(0), n=40, e=4, k=2, h=6, i=5)
    for a, b in zip(expert_grads(blocked_expert_ffn, *inputs), expert_grads(ragged_expert_ffn, *inputs)):
        np.testing.assert_allclose(a, b, atol=1e-4)


def test_load_balancing_loss_hand_case():
    # one layer, two tokens, E=2, k=1. Token 0 probs (0.75, 0.25) -> expert 0; token 1 (0.25, 0.75) -> 1.
    logits = jnp.log(jnp.array([[[0.75, 0.25], [0.25, 0.75]]]))
    # f = (0.5, 0.5), P = (0.5, 0.5) -> 2 * (0.25 + 0.25) = 1
    np.testing.assert_allclose(load_balancing_loss(logits, 1), 1.0, rtol=1e-6)
    # masking token 1: f = (1, 0), P = (0.75, 0.25) -> 2 * 0.75 = 1.5
    np.testing.assert_allclose(load_balancing_loss(logits, 1, jnp.array([1, 0])), 1.5, rtol=1e-6)


def test_load_balancing_loss_matches_transformers():
    torch = pytest.importorskip("torch")
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import load_balancing_loss_func

    r = np.random.RandomState(0)
    layers, b, t, e, k = 3, 2, 5, 8, 2
    logits = r.randn(layers, b * t, e).astype(np.float32)
    mask = np.ones((b, t), np.int64)
    mask[0, :2] = 0
    ref = load_balancing_loss_func(tuple(torch.tensor(x) for x in logits), e, k, torch.tensor(mask))
    ours = load_balancing_loss(jnp.asarray(logits), k, jnp.asarray(mask.reshape(-1)))
    np.testing.assert_allclose(ours, ref.item(), rtol=1e-5)
    ref_nomask = load_balancing_loss_func(tuple(torch.tensor(x) for x in logits), e, k)
    np.testing.assert_allclose(load_balancing_loss(jnp.asarray(logits), k), ref_nomask.item(), rtol=1e-5)


def test_router_z_loss_hand_case():
    logits = jnp.zeros((1, 2, 4))                        # logsumexp = log 4 for both tokens
    np.testing.assert_allclose(router_z_loss(logits), math.log(4) ** 2, rtol=1e-6)
    logits = logits.at[0, 1].set(jnp.log(jnp.array([1.0, 1.0, 1.0, 5.0])))   # logsumexp = log 8
    np.testing.assert_allclose(router_z_loss(logits, jnp.array([0, 1])), math.log(8) ** 2, rtol=1e-6)


def test_mtp_loss_targets_token_t_plus_2():
    v = 3
    ids = jnp.array([[0, 1, 2, 1]])
    logits = jnp.zeros((1, 4, v)).at[0, 0, 2].set(10.0)   # position 0 predicts ids[2] = 2 confidently
    per_pos = [-jax.nn.log_softmax(logits[0, p])[ids[0, p + 2]] for p in (0, 1)]
    np.testing.assert_allclose(mtp_loss(logits, ids), (per_pos[0] + per_pos[1]) / 2, rtol=1e-6)
    np.testing.assert_allclose(mtp_loss(logits, ids, jnp.array([[1, 1, 1, 0]])), per_pos[0], rtol=1e-6)


def test_unit_lower_triangular_inverse():
    from hat_jax.model.deltanet import unit_lower_triangular_inverse

    r = np.random.RandomState(0)
    for c in (1, 2, 8, 64):
        m = r.randn(3, c, c) * 0.2
        inv = np.asarray(unit_lower_triangular_inverse(jnp.asarray(m, jnp.float32)), np.float64)
        full = np.eye(c) + np.tril(m, -1)
        np.testing.assert_allclose(inv, np.linalg.inv(full), atol=1e-5)
        np.testing.assert_allclose(full @ inv, np.broadcast_to(np.eye(c), full.shape), atol=1e-5)
        assert np.all(np.triu(inv, 1) == 0)
    with pytest.raises(ValueError, match="power of two"):
        unit_lower_triangular_inverse(jnp.zeros((3, 3)))


def test_unit_lower_triangular_inverse_gradient_matches_autodiff_of_the_recursion():
    from hat_jax.model.deltanet import _block_inverse, unit_lower_triangular_inverse

    r = np.random.RandomState(1)
    m = jnp.asarray(r.randn(2, 16, 16) * 0.2, jnp.float32)
    w = jnp.asarray(r.randn(2, 16, 16), jnp.float32)
    g_custom = jax.grad(lambda a: jnp.sum(jnp.sin(unit_lower_triangular_inverse(a)) * w))(m)
    g_auto = jax.grad(lambda a: jnp.sum(jnp.sin(_block_inverse(a)) * w))(m)
    np.testing.assert_allclose(g_custom, g_auto, atol=1e-5)
