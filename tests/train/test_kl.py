"""OPD losses: sampled-token and exact (vocabulary-chunked) reverse KL against direct numpy computations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hat_jax.train.kl import (OPD_LOSSES, check_opd_loss, exact_reverse_kl, reverse_kl_per_token,
                              reverse_kl_per_token_chunked, sampled_reverse_kl_loss)


def _np_log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _np_reverse_kl(zs, zt):
    ls, lt = _np_log_softmax(zs.astype(np.float64)), _np_log_softmax(zt.astype(np.float64))
    kl = (np.exp(ls) * (ls - lt)).sum(-1)
    return np.concatenate([np.zeros(kl.shape[:1] + (1,)), kl[:, :-1]], axis=1)    # entry t from position t-1


RNG = np.random.default_rng(0)
OLD = np.log(RNG.uniform(0.05, 0.9, (2, 5))).astype(np.float32)
TEACH = np.log(RNG.uniform(0.05, 0.9, (2, 5))).astype(np.float32)
LP = (OLD + RNG.uniform(-0.4, 0.4, (2, 5))).astype(np.float32)
MASK = np.array([[0, 1, 1, 1, 1], [0, 1, 1, 0, 0]])


@pytest.mark.parametrize("clip_eps", [None, 0.1])
def test_sampled_reverse_kl_against_numpy(clip_eps):
    loss, m = sampled_reverse_kl_loss(jnp.asarray(LP), OLD, TEACH, MASK, clip_eps=clip_eps)
    adv = -(OLD - TEACH)                                   # per-token advantage -(log pi_old - log pi_T)
    rho = np.exp(LP - OLD)
    obj = rho * adv if clip_eps is None else np.minimum(rho * adv, np.clip(rho, 1 - clip_eps, 1 + clip_eps) * adv)
    assert float(loss) == pytest.approx(-(obj * MASK).sum() / MASK.sum(), rel=1e-5)
    assert float(m["reverse_kl_k1"]) == pytest.approx(((OLD - TEACH) * MASK).sum() / MASK.sum(), rel=1e-5)
    r = np.exp(TEACH - OLD)
    assert float(m["reverse_kl_k3"]) == pytest.approx(((r - 1 - np.log(r)) * MASK).sum() / MASK.sum(), rel=1e-5)
    grad = jax.grad(lambda lp: sampled_reverse_kl_loss(lp, OLD, TEACH, MASK, clip_eps=clip_eps)[0])(jnp.asarray(LP))
    unclipped = (obj == rho * adv) if clip_eps is not None else np.ones_like(rho, bool)
    np.testing.assert_allclose(grad, -(rho * adv * unclipped * MASK) / MASK.sum(), atol=1e-6)
    if clip_eps is not None:
        assert float(m["clip_frac"]) > 0                   # the example does reach the clip


def test_sampled_estimator_expected_gradient_is_the_exact_reverse_kl_gradient():
    # One position, V = 5, theta = theta_old. E_{y ~ pi_theta}[grad loss(y)] must equal grad KL(pi_theta || pi_T).
    theta = jnp.array([0.3, -1.0, 2.0, 0.5, -0.2])
    teacher = jnp.array([1.0, 0.0, 0.5, -0.5, 0.2])
    mask = jnp.array([[0, 1]])

    def loss_for_token(th, v):
        lp_v = jax.nn.log_softmax(th)[v]
        lp = jnp.stack([0.0, lp_v])[None]
        old = jax.lax.stop_gradient(lp)
        tl = jnp.stack([0.0, jax.nn.log_softmax(teacher)[v]])[None]
        return sampled_reverse_kl_loss(lp, old, tl, mask)[0]

    grads = jax.vmap(jax.grad(loss_for_token), in_axes=(None, 0))(theta, jnp.arange(5))     # [V, V]
    expected = jnp.sum(jax.nn.softmax(theta)[:, None] * grads, axis=0)
    kl = lambda th: jnp.sum(jax.nn.softmax(th) * (jax.nn.log_softmax(th) - jax.nn.log_softmax(teacher)))
    np.testing.assert_allclose(expected, jax.grad(kl)(theta), atol=1e-6)


def test_exact_reverse_kl_plain_against_numpy():
    zs = RNG.normal(size=(2, 5, 7)).astype(np.float32) * 2
    zt = RNG.normal(size=(2, 5, 7)).astype(np.float32) * 2
    got = reverse_kl_per_token(jnp.asarray(zs), jnp.asarray(zt))
    np.testing.assert_allclose(got, _np_reverse_kl(zs, zt), atol=1e-5)
    np.testing.assert_allclose(reverse_kl_per_token(jnp.asarray(zs), jnp.asarray(zt), temperature=0.5),
                               _np_reverse_kl(zs / 0.5, zt / 0.5), atol=1e-5)
    loss, m = exact_reverse_kl(jnp.asarray(zs), jnp.asarray(zt), MASK)
    ref = _np_reverse_kl(zs, zt)
    assert float(loss) == pytest.approx((ref * MASK).sum() / MASK.sum(), rel=1e-5)
    assert float(m["reverse_kl_max"]) == pytest.approx((ref * MASK).max(), rel=1e-5)


@pytest.mark.parametrize("chunk", [3, 7, 100])
def test_exact_reverse_kl_chunked_against_numpy_and_plain_gradient(chunk):
    hs, ks = RNG.normal(size=(2, 5, 6)).astype(np.float32), RNG.normal(size=(6, 7)).astype(np.float32)
    # the teacher's hidden size differs from the student's
    ht, kt = RNG.normal(size=(2, 5, 4)).astype(np.float32), RNG.normal(size=(4, 7)).astype(np.float32)
    got = reverse_kl_per_token_chunked(hs, ks, ht, kt, chunk=chunk, temperature=0.8)
    np.testing.assert_allclose(got, _np_reverse_kl(hs @ ks / 0.8, ht @ kt / 0.8), atol=2e-5)

    def chunked(hs_, ks_, ht_, kt_):
        return exact_reverse_kl((hs_, ks_), (ht_, kt_), MASK, chunk=chunk, aggregation="seq-mean-token-mean")[0]

    def plain(hs_, ks_, ht_, kt_):
        return exact_reverse_kl(hs_ @ ks_, ht_ @ kt_, MASK, aggregation="seq-mean-token-mean")[0]

    gc = jax.grad(chunked, (0, 1, 2, 3))(hs, ks, ht, kt)
    gp = jax.grad(plain, (0, 1))(hs, ks, ht, kt)
    np.testing.assert_allclose(gc[0], gp[0], atol=1e-5)
    np.testing.assert_allclose(gc[1], gp[1], atol=1e-5)
    assert not np.any(gc[2]) and not np.any(gc[3])           # the teacher is frozen


def test_exact_reverse_kl_jit_and_bad_inputs():
    hs, ks = jnp.ones((1, 3, 2)), jnp.eye(2, 5)
    f = jax.jit(lambda a, b: exact_reverse_kl((a, b), (a, 2 * b), jnp.array([[0, 1, 1]]), chunk=2)[0])
    # p_s = softmax([1,1,0,0,0]) (e/(2e+3) each on two ids), p_T = softmax([2,2,0,0,0]); KL > 0
    ps = np.exp([1, 1, 0, 0, 0]) / np.exp([1, 1, 0, 0, 0]).sum()
    pt = np.exp([2, 2, 0, 0, 0]) / np.exp([2, 2, 0, 0, 0]).sum()
    assert float(f(hs, ks)) == pytest.approx(float((ps * np.log(ps / pt)).sum()), rel=1e-5)
    with pytest.raises(ValueError, match="both be logits"):
        exact_reverse_kl((hs, ks), hs @ ks, jnp.ones((1, 3)), chunk=2)
    with pytest.raises(ValueError, match="chunk"):
        exact_reverse_kl((hs, ks), (hs, ks), jnp.ones((1, 3)))
    assert OPD_LOSSES == ("sampled", "exact") and check_opd_loss("exact") == "exact"
    with pytest.raises(ValueError, match="sampled, exact"):
        check_opd_loss("forward")
