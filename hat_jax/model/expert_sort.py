"""The expert-sorted layout of MoE assignments, built from gathers only (no scatters): `take_rows`, a one-to-one
row map whose gradient is the inverse gather (`permute_rows`, the permutation case), and `sorted_assignments`, the tokens repeated once per chosen
expert and ordered by expert id (the input layout of a grouped matmul), and `scan_row_chunks`, a row-wise function run over chunks of
rows in a rematerialised scan (the token-chunked dispatch). Used by the token-local dispatch
(`hat_jax.model.moe`) and by expert parallelism (`hat_jax.model.expert_parallel`).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np


def _take(x: jax.Array, idx: jax.Array, fill: bool) -> jax.Array:
    return jnp.take(x, idx, axis=0, mode="fill", fill_value=0) if fill else x[idx]


@partial(jax.custom_vjp, nondiff_argnums=(3,))
def take_rows(x: jax.Array, idx: jax.Array, inverse: jax.Array, fill: bool = True) -> jax.Array:
    """x[idx] for a one-to-one map of rows, with zero rows where idx is out of range (idx[i] = len(x)),
    whose gradient is the inverse gather g[inverse] (zero where inverse is out of range) instead of
    autodiff's scatter-add. Both directions are gathers: XLA:CPU runs a row scatter as a serial loop (the
    blocked MoE's fwd+bwd was ~5x slower with scatters, experiments/benchmarks/cpu_profile.py), and TPU
    scatters of bf16 rows cost several [M, H] u32 buffers each (1 GiB per 131,072 x 2,048 rows, measured
    in the AOT memory report).

    Args:
        x: [M, ...]. idx: [P] int32 in [0, M] (M = a zero row). inverse: [M] int32 in [0, P] with
        inverse[idx[i]] = i for every i whose idx[i] < M, and inverse[j] = P for a row j that idx never names.
        fill: False when every index of both maps is in range (a permutation: plain gathers, no bounds mask).
    Returns:
        [P, ...] x[idx], zero rows where idx[i] = M.
    """
    return _take(x, idx, fill)


def _take_fwd(x, idx, inverse, fill):
    return _take(x, idx, fill), (idx, inverse)


def _take_bwd(fill, res, g):
    idx, inverse = res
    zero = lambda a: np.zeros(a.shape, jax.dtypes.float0)
    return _take(g, inverse, fill), zero(idx), zero(inverse)


take_rows.defvjp(_take_fwd, _take_bwd)


def permute_rows(x: jax.Array, perm: jax.Array, inverse: jax.Array) -> jax.Array:
    """x[perm] for a permutation `perm` of x's rows (`inverse` = argsort(perm)), gradient g[inverse]
    (`take_rows` with every index in range).

    Args:
        x: [M, ...]. perm, inverse: [M] int32, inverse[perm[i]] = i.
    Returns:
        [M, ...] x[perm].
    """
    return take_rows(x, perm, inverse, False)


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


def scan_row_chunks(fn, chunk: int | None, rows, shared=()):
    """`fn(*rows, *shared)` computed `chunk` rows at a time: the rows are zero-padded to a multiple of `chunk`,
    split into C = ceil(N / chunk) chunks and run through a `jax.lax.scan` whose body is `jax.checkpoint`ed, so
    fn's intermediates exist for one chunk at a time, in the forward pass and in the backward pass (which
    recomputes each chunk's forward); the gradients of `shared` are summed over the chunks by the scan's
    transpose. `fn` must treat rows independently (its result rows depend only on the same input rows; it may
    use collectives, as long as every device runs the same chunks) and must accept padding rows of zeros.
    `chunk` None, or >= N: the plain call (same program).

    Args:
        fn: (*rows [c, ...], *shared) -> [c, ...]. chunk: rows per chunk (> 0) or None.
        rows: arrays with the same leading dimension N. shared: arrays used by every chunk (weights).
    Returns:
        fn's [N, ...] result, equal to the plain call.
    Raises:
        ValueError: chunk < 1.
    """
    if chunk is not None and chunk < 1:
        raise ValueError(f"moe_token_chunk = {chunk}: expected a positive number of tokens per chunk, or None")
    n = rows[0].shape[0]
    if chunk is None or chunk >= n:
        return fn(*rows, *shared)
    num = -(-n // chunk)
    pad = num * chunk - n
    stacked = [jnp.pad(r, ((0, pad),) + ((0, 0),) * (r.ndim - 1)).reshape(num, chunk, *r.shape[1:]) for r in rows]

    @jax.checkpoint
    def step(shared, xs):
        return fn(*xs, *shared)

    _, out = jax.lax.scan(lambda carry, xs: (carry, step(tuple(shared), xs)), None, stacked)
    return out.reshape(num * chunk, *out.shape[2:])[:n]
