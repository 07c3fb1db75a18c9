"""Masked CE, k3 KL, aggregation modes and the clipped policy loss: small hand-computed cases (token log-probs
are tests/rollout/test_logprobs.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hat_jax.train.losses import (AGGREGATIONS, aggregate, clipped_policy_loss, counted_rows_nll_sum, k3_kl,
                                  masked_token_ce_sum, masked_token_ce_sum_chunked, masked_token_ce_sum_counted_rows)


@pytest.mark.parametrize("chunk", [1, 3, 4, 11, 64])
def test_chunked_ce_gradients_equal_plain(chunk):
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    hidden = jax.random.normal(k1, (2, 5, 8))
    kernel = jax.random.normal(k2, (8, 11)) * 2.0          # V = 11: most chunk sizes leave a shifted last chunk
    ids = jax.random.randint(k3, (2, 5), 0, 11)
    mask = jnp.ones((2, 5)).at[:, 0].set(0)

    def f_plain(h, k):
        return masked_token_ce_sum(h @ k, ids, mask)[0]

    def f_chunk(h, k):
        return masked_token_ce_sum_chunked(h, k, ids, mask, chunk=chunk)[0]

    gp, gc = jax.grad(f_plain, (0, 1))(hidden, kernel), jax.grad(f_chunk, (0, 1))(hidden, kernel)
    for a, b in zip(gc, gp):
        assert np.all(np.isfinite(a))
        np.testing.assert_allclose(a, b, atol=1e-4)


@pytest.mark.parametrize("block_rows", [1, 3, 7, 16, 64])
def test_counted_rows_ce_equals_full_logits_packed(block_rows):
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(1), 3)
    hidden = jax.random.normal(k1, (2, 16, 8))
    kernel = jax.random.normal(k2, (8, 11)) * 2.0
    ids = jax.random.randint(k3, (2, 16), 0, 11)
    # loss tokens only in a few spans (most 7-row blocks hold none), one span crossing into the next document
    mask = jnp.zeros((2, 16)).at[0, 3:6].set(1).at[0, 9:11].set(1).at[1, 13:16].set(1)
    segment_ids = jnp.array([[1] * 10 + [2] * 6, [1] * 12 + [0] * 4])     # row 1 ends in padding

    def full(h, k):
        return masked_token_ce_sum(h @ k, ids, mask, segment_ids)

    def counted(h, k):
        return masked_token_ce_sum_counted_rows(h, k, ids, mask, segment_ids, block_rows)

    (cf, nf), (cc, nc) = full(hidden, kernel), counted(hidden, kernel)
    assert float(nc) == float(nf) == 4.0           # token 10 starts document 2 and 13-15 are padding: not targets
    np.testing.assert_allclose(cc, cf, rtol=1e-6)
    grads = [jax.grad(lambda h, k, f=f: f(h, k)[0], (0, 1))(hidden, kernel) for f in (full, jax.jit(counted))]
    for a, b in zip(*grads):
        np.testing.assert_allclose(a, b, atol=1e-5)
    np.testing.assert_array_equal(grads[1][0][1], 0.0)   # row 1 predicts no loss token: no gradient reaches it


def test_counted_rows_nll_sum_of_nothing_is_zero():
    rows, kernel = jnp.ones((5, 4)), jnp.ones((4, 3))
    assert float(counted_rows_nll_sum(rows, kernel, jnp.zeros(5, jnp.int32), jnp.zeros(5), 2)) == 0.0
    # uniform logits: each counted row costs log V, weighted
    np.testing.assert_allclose(counted_rows_nll_sum(rows, kernel, jnp.zeros(5, jnp.int32),
                                                    jnp.array([0, 0, 0, 0, 2.0]), 2), 2 * np.log(3), rtol=1e-6)


def test_masked_ce_sum_and_count():
    logits = jnp.zeros((1, 4, 4))                           # uniform: every token has NLL log 4
    ids = jnp.array([[3, 1, 2, 0]])
    mask = jnp.array([[0, 1, 0, 1]])
    s, n = masked_token_ce_sum(logits, ids, mask)
    np.testing.assert_allclose(s, 2 * np.log(4.0), rtol=1e-6)
    assert float(n) == 2.0


def test_grad_accumulation_equals_full_batch_token_mean():
    # A linear "model" logits = x @ W; micro-batches with very different token counts (5 vs 1).
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(1), 3)
    x = jax.random.normal(k1, (4, 6, 5))
    w = jax.random.normal(k2, (5, 7))
    ids = jax.random.randint(k3, (4, 6), 0, 7)
    mask = jnp.array([[0, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0], [0, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]])

    def token_mean(w, rows):
        s, n = masked_token_ce_sum(x[rows] @ w, ids[rows], mask[rows])
        return s / n

    full = jax.grad(token_mean)(w, slice(0, 4))
    total = float(mask.sum())                               # 6 tokens in all
    acc = sum(jax.grad(lambda w, r=r: masked_token_ce_sum(x[r] @ w, ids[r], mask[r])[0] / total)(w)
              for r in (slice(0, 2), slice(2, 4)))
    np.testing.assert_allclose(acc, full, atol=1e-6)
    # averaging per-micro-batch means (the common bug) weights the 1-token micro-batch 5x too much
    wrong = 0.5 * (jax.grad(token_mean)(w, slice(0, 2)) + jax.grad(token_mean)(w, slice(2, 4)))
    assert not np.allclose(wrong, full, atol=1e-3)


def test_k3_hand_values():
    lp = jnp.log(jnp.array([[0.5, 0.5, 0.5]]))
    ref = jnp.log(jnp.array([[0.25, 0.5, 1.0]]))
    # r = ref/p: 0.5 -> 0.5 - 1 - log 0.5 = 0.193147; 1 -> 0; 2 -> 2 - 1 - log 2 = 0.306853
    np.testing.assert_allclose(k3_kl(lp, ref), [[0.193147, 0.0, 0.306853]], atol=1e-6)


L = jnp.array([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]])
M = jnp.array([[0, 1, 1, 1], [0, 1, 0, 0]])                # lengths 3 and 1


def test_aggregation_modes_differ_as_the_formulas_say():
    # token-mean: (2+3+4+6)/4 = 3.75; seq-mean-token-mean: (9/3 + 6/1)/2 = 4.5;
    # seq-mean-token-sum-norm with L_max = 4: (9+6)/(2*4) = 1.875
    assert float(aggregate(L, M, "token-mean")) == pytest.approx(3.75)
    assert float(aggregate(L, M, "seq-mean-token-mean")) == pytest.approx(4.5)
    assert float(aggregate(L, M, "seq-mean-token-sum-norm", max_len=4)) == pytest.approx(1.875)
    assert float(aggregate(L, jnp.zeros_like(M), "token-mean")) == 0.0   # empty mask: 0, not NaN


def test_aggregation_micro_batches_sum_to_full_batch():
    for mode in AGGREGATIONS:
        full = aggregate(L, M, mode, max_len=4)
        parts = sum(aggregate(L[i:i + 1], M[i:i + 1], mode, max_len=4, total_tokens=M.sum(), total_sequences=2)
                    for i in range(2))
        assert float(parts) == pytest.approx(float(full)), mode


def test_aggregation_bad_names():
    with pytest.raises(ValueError, match="token-mean, seq-mean-token-mean, seq-mean-token-sum-norm"):
        aggregate(L, M, "mean")
    with pytest.raises(ValueError, match="max_len"):
        aggregate(L, M, "seq-mean-token-sum-norm")


# One row, tokens 1..5 active, eps_low 0.2, eps_high 0.28 (clip range [0.8, 1.28]):
#   t  ratio  A   -A*r   -A*clip(r)  L=max   dL/dlogp   branch
#   1  1.1   +1   -1.1   -1.1        -1.1    -1.1       inside
#   2  1.5   +1   -1.5   -1.28       -1.28    0         clipped high
#   3  0.5   -1    0.5    0.8         0.8     0         clipped low
#   4  1.5   -1    1.5    1.28        1.5     1.5       outside but unclipped (pessimistic side)
#   5  0.5   +1   -0.5   -0.8        -0.5    -0.5       outside but unclipped
# token-mean: (-1.1 - 1.28 + 0.8 + 1.5 - 0.5) / 5 = -0.116; gradient = [0, -1.1, 0, 0, 1.5, -0.5] / 5
RATIO = jnp.array([[1.0, 1.1, 1.5, 0.5, 1.5, 0.5]])
ADV = jnp.array([[0.0, 1.0, 1.0, -1.0, -1.0, 1.0]])
MASK = jnp.array([[0, 1, 1, 1, 1, 1]])
OLD = jnp.full((1, 6), np.log(0.3), jnp.float32)
LP = OLD + jnp.log(RATIO)


def test_clipped_policy_loss_both_sides_of_the_clip():
    loss, m = clipped_policy_loss(LP, OLD, ADV, MASK, eps_low=0.2, eps_high=0.28)
    assert float(loss) == pytest.approx(-0.116, abs=1e-6)
    grad = jax.grad(lambda lp: clipped_policy_loss(lp, OLD, ADV, MASK, eps_low=0.2, eps_high=0.28)[0])(LP)
    np.testing.assert_allclose(grad, [[0.0, -1.1 / 5, 0.0, 0.0, 1.5 / 5, -0.5 / 5]], atol=1e-6)
    assert float(m["clip_frac_high"]) == pytest.approx(0.2) and float(m["clip_frac_low"]) == pytest.approx(0.2)
    assert float(m["clip_frac"]) == pytest.approx(0.4)
    assert float(m["ratio_mean"]) == pytest.approx(5.1 / 5, abs=1e-6)
    assert float(m["ratio_max"]) == pytest.approx(1.5, abs=1e-6)
    r = np.array([1.1, 1.5, 0.5, 1.5, 0.5])
    assert float(m["approx_kl"]) == pytest.approx(np.mean(r - 1 - np.log(r)), abs=1e-6)
    assert float(m["kl"]) == 0.0


def test_clipped_policy_loss_sequence_advantage_and_k3_kl_term():
    # advantages [N] broadcast over tokens; ratio 1 everywhere: pg = -A on each of 2 tokens.
    lp = jnp.log(jnp.array([[0.5, 0.5, 0.5]]))
    ref = jnp.log(jnp.array([[0.5, 0.25, 1.0]]))
    mask = jnp.array([[0, 1, 1]])
    loss, m = clipped_policy_loss(lp, lp, jnp.array([2.0]), mask, ref_logprobs=ref, beta=0.1)
    # token-mean: -2 + 0.1 * (0.193147 + 0.306853) / 2 = -2 + 0.025 = -1.975
    assert float(loss) == pytest.approx(-1.975, abs=1e-6)
    assert float(m["kl"]) == pytest.approx(0.25, abs=1e-6)
    # d/dlp of k3 = 1 - exp(ref - lp): token 1 -> 0.5, token 2 -> -1; pg grad -A*ratio = -2
    g = jax.grad(lambda x: clipped_policy_loss(x, lp, jnp.array([2.0]), mask, ref_logprobs=ref, beta=0.1)[0])(lp)
    np.testing.assert_allclose(g, [[0.0, (-2 + 0.05) / 2, (-2 - 0.1) / 2]], atol=1e-6)
    with pytest.raises(ValueError, match="ref_logprobs"):
        clipped_policy_loss(lp, lp, jnp.array([2.0]), mask, beta=0.1)


def test_clipped_policy_loss_jit():
    f = jax.jit(clipped_policy_loss, static_argnames=("aggregation", "max_len", "eps_low", "eps_high"))
    loss, m = f(LP, OLD, ADV, MASK, eps_low=0.2, eps_high=0.28, aggregation="seq-mean-token-sum-norm", max_len=8)
    # one sequence: sum of L = -0.58, / (1 * 8)
    assert float(loss) == pytest.approx(-0.58 / 8, abs=1e-6)
    assert float(m["clip_frac"]) == pytest.approx(0.4)


def test_k3_is_never_negative_from_rounding():
    """exp(d) - d - 1 is -6e-8 at d = 4e-7 in float32; k3 is clamped at 0 and accurate for small d."""
    d = jnp.asarray(np.linspace(-1e-3, 1e-3, 20001), jnp.float32)
    k3 = k3_kl(jnp.zeros_like(d), d)
    assert float(jnp.min(k3)) >= 0.0 and float(k3_kl(jnp.zeros(1), jnp.asarray([4e-7]))[0]) >= 0.0
    np.testing.assert_allclose(k3, np.asarray(d, np.float64) ** 2 / 2, atol=1e-9)
