"""The expert-sorted layout of MoE assignments, built from gathers only (no scatters): `permute_rows`, a row
permutation whose gradient is the inverse gather, and `sorted_assignments`, the tokens repeated once per chosen
expert and ordered by expert id (the input layout of a grouped matmul). Used by the token-local dispatch
(`hat_jax.model.moe`) and by expert parallelism (`hat_jax.model.expert_parallel`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


@jax.custom_vjp
def permute_rows(x: jax.Array, perm: jax.Array, inverse: jax.Array) -> jax.Array:
    """x[perm] for a permutation `perm` of x's rows (`inverse` = argsort(perm)), whose gradient is the
    inverse gather g[inverse] instead of autodiff's scatter-add (TPU scatters of bf16 rows cost several
    [M, H] u32 buffers each: 1 GiB per 131,072 x 2,048 assignment rows, measured in the AOT memory report).

    Args:
        x: [M, ...]. perm, inverse: [M] int32, inverse[perm[i]] = i.
    Returns:
        [M, ...] x[perm].
    """
    return x[perm]


def _permute_fwd(x, perm, inverse):
    return x[perm], (perm, inverse)


def _permute_bwd(res, g):
    perm, inverse = res
    zero = lambda a: np.zeros(a.shape, jax.dtypes.float0)
    return g[inverse], zero(perm), zero(inverse)


permute_rows.defvjp(_permute_fwd, _permute_bwd)


def sorted_assignments(x: jax.Array, expert_ids: jax.Array):
    """The expert-sorted layout of a grouped matmul, without scatters: (rows [N*k, H] = token of each
    assignment in expert order, flat expert ids [N*k] int32 in token order, unsort: [N*k, H'] -> [N, k, H']
    back in token order). Each token is repeated k times (gradient: a sum over its k copies), then rows are
    permuted by a stable sort of the expert ids (`permute_rows`, gradient by the inverse permutation).

    Args:
        x: [N, H]. expert_ids: [N, k] int32 in [0, E) (E from the caller's weights: `num_experts`).
    """
    n, k = expert_ids.shape
    flat = expert_ids.reshape(n * k)
    order = jnp.argsort(flat, stable=True).astype(jnp.int32)
    inverse = jnp.argsort(order).astype(jnp.int32)
    rows = permute_rows(jnp.repeat(x, k, axis=0), order, inverse)
    unsort = lambda y: permute_rows(y, inverse, order).reshape(n, k, -1)
    return rows, flat, unsort
