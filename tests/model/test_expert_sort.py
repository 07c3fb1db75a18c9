"""take_rows: a one-to-one row map whose gradient is the inverse gather; the blocked MoE dispatch built on it
has no row scatter in its forward or backward program."""

import jax
import jax.numpy as jnp
import numpy as np

from hat_jax.model.expert_sort import permute_rows, take_rows
from hat_jax.model.moe import blocked_expert_ffn, blocked_layout


def test_take_rows_forward_and_gradient_equal_autodiff_of_the_plain_gather():
    r = np.random.RandomState(0)
    x = jnp.asarray(r.randn(5, 3), jnp.float32)
    idx = jnp.asarray([3, 5, 0, 5, 4, 1, 5], jnp.int32)          # 5 = a zero row; row 2 is never taken
    inverse = jnp.asarray([2, 5, 7, 0, 4], jnp.int32)            # 7 = not taken
    plain = lambda x: jnp.take(x, idx, axis=0, mode="fill", fill_value=0)
    np.testing.assert_array_equal(take_rows(x, idx, inverse), plain(x))
    np.testing.assert_array_equal(take_rows(x, idx, inverse)[jnp.array([1, 3, 6])], 0.0)
    w = jnp.asarray(r.randn(7, 3), jnp.float32)
    grad = lambda f: jax.grad(lambda x: jnp.sum(f(x) * w))(x)
    np.testing.assert_array_equal(grad(lambda x: take_rows(x, idx, inverse)), grad(plain))
    np.testing.assert_array_equal(grad(lambda x: take_rows(x, idx, inverse))[2], 0.0)


def test_permute_rows_gradient_is_the_inverse_permutation():
    x = jnp.arange(12.0).reshape(4, 3)
    perm = jnp.asarray([2, 0, 3, 1], jnp.int32)
    inverse = jnp.argsort(perm).astype(jnp.int32)
    np.testing.assert_array_equal(permute_rows(x, perm, inverse), x[perm])
    w = jnp.arange(12.0).reshape(4, 3) + 1
    np.testing.assert_array_equal(jax.grad(lambda x: jnp.sum(permute_rows(x, perm, inverse) * w))(x), w[inverse])


def test_blocked_layout_places_every_assignment_once_in_its_experts_blocks():
    ids = jnp.asarray([[1, 0], [1, 2], [0, 1], [2, 0], [1, 2]], jnp.int32)   # experts 0 x3, 1 x4, 2 x3
    bk, slot, assignment, block_expert = blocked_layout(ids, 4)
    m = ids.size
    assert assignment.shape == (-(-(m + 4 * (bk - 1)) // bk) * bk,)
    assert int(jnp.sum(assignment < m)) == m
    np.testing.assert_array_equal(assignment[slot], np.arange(m))               # one-to-one
    np.testing.assert_array_equal(block_expert[slot // bk], ids.reshape(-1))    # each lands in its expert's block
    np.testing.assert_array_equal(np.diff(np.asarray(slot).reshape(-1)[np.argsort(ids.reshape(-1), stable=True)]) > 0,
                                  True)                                          # stable order within an expert


def test_blocked_dispatch_moves_float_rows_without_scatter():
    r = np.random.RandomState(1)
    x = jnp.asarray(r.randn(64, 8), jnp.float32)
    ids = jnp.asarray(np.stack([r.choice(4, 2, replace=False) for _ in range(64)]), jnp.int32)
    gate_up = jnp.asarray(r.randn(4, 8, 12), jnp.float32)
    down = jnp.asarray(r.randn(4, 6, 8), jnp.float32)
    loss = lambda x, gu, dn: jnp.sum(blocked_expert_ffn(x, ids, gu, dn) ** 2)
    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(x, gate_up, down).jaxpr
    float_scatters = [line.strip() for line in str(jaxpr).splitlines()
                      if "scatter" in line and "=" in line and "f32[" in line.split("=")[0]]
    assert float_scatters
    # the only float scatter left is the weight gradient of the per-block expert-weight gather ([B, H, F] into [E, H, F])
    assert all("f32[4,8,12]" in line or "f32[4,6,8]" in line for line in float_scatters), float_scatters
