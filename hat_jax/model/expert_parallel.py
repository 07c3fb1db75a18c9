"""Expert parallelism: the MoE dispatch that sends tokens to the devices holding their experts.

Under a mesh whose 'expert' axis has P > 1 devices, each device holds E/P experts (the contiguous slice
[j*E/P, (j+1)*E/P) on expert index j, the `DEFAULT_RULES` sharding of the experts' first dimension) and its own
token rows (the batch axes 'data', 'fsdp', 'expert', and 'context' under context parallelism). `expert_parallel_ffn` runs, in one `jax.shard_map`:

1. a local sort of the device's N*k assignments by expert id (`sorted_assignments`); sorted by expert they are
   also grouped by destination device;
2. an all-gather of the per-expert counts over 'expert' ([P, E] int32: every device knows the whole exchange);
3. `ragged_exchange` of the rows to the experts' devices (a ragged all-to-all: each device receives, from each
   source in source order, the rows for its experts);
4. a local regroup of the received rows by local expert (`received_to_grouped`, a gather), the grouped matmul
   on the E/P local experts only (`hat_jax.model.moe.ragged_grouped_ffn` or `megablox_grouped_ffn`), rows past
   the received total set to zero, the regroup undone;
5. the reverse `ragged_exchange` (same counts, transposed), and the local unsort to [N, k, H].

The expert weights enter sharded on 'expert' (and on 'fsdp'/'tensor' as stored); only their fsdp/tensor parts
are all-gathered inside (the FSDP gather, whose transpose is a reduce-scatter), so no device gathers another
device's experts and the weight gradients come out sharded. Dropless: the receive buffer holds the worst case
(all P devices' N*k rows on one device), so no token is dropped whatever the routing. With a `token_chunk`, steps
1-5 run on chunks of each device's rows, buffers sized by the chunk (`expert_parallel_ffn`'s `token_chunk`).

This is GShard's expert-parallel dispatch (Lepikhin et al. 2020) with DeepSpeed-MoE's (Rajbhandari et al. 2022)
and MegaBlocks' dropless grouped matmul, organised as MaxText's `moe.py` shard_map + `ragged_all_to_all` path
(AI-Hypercomputer/maxtext), written here from their descriptions.

`jax.lax.ragged_all_to_all` compiles for TPU and GPU only (XLA:CPU has no thunk for it), so on CPU
`ragged_exchange` is an exact equivalent built from a dense `all_to_all` at a static worst-case capacity; the
CPU tests run the same dispatch logic. Its gradient is the reverse exchange on both platforms (custom VJP).
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp

from hat_jax.model.expert_sort import permute_rows, scan_row_chunks, sorted_assignments
from hat_jax.model.sharding import active_mesh_shape, fitted_spec, target_platform

EXPERT_AXIS = "expert"
ROW_AXES = ("data", "fsdp", "expert", "context")  # the token rows' axes (DEFAULT_RULES' "tokens")


def _exclusive_cumsum(x: jax.Array, axis: int = -1) -> jax.Array:
    return jnp.cumsum(x, axis=axis) - x


def exchange_plan(counts: jax.Array, me: jax.Array):
    """The ragged all-to-all arguments of device `me` (pack-by-peer layouts on both sides).

    Args:
        counts: [P, P] int32, counts[s, d] = rows device s sends to device d (the same on every device).
        me: scalar int32, this device's index on the axis.
    Returns:
        (input_offsets [P]: where the rows for each destination start in my operand, send_sizes [P],
         output_offsets [P]: where my rows land in each destination's output (sources in order),
         recv_offsets [P]: where each source's rows land in my output, recv_sizes [P]), all int32.
    """
    send_sizes, recv_sizes = counts[me], counts[:, me]
    output_offsets = _exclusive_cumsum(counts, axis=0)[me]
    return _exclusive_cumsum(send_sizes), send_sizes, output_offsets, _exclusive_cumsum(recv_sizes), recv_sizes


def _exchange_ragged(x, counts, out_rows, axis_name):
    input_offsets, send_sizes, output_offsets, _, recv_sizes = exchange_plan(counts, jax.lax.axis_index(axis_name))
    out = jnp.zeros((out_rows,) + x.shape[1:], x.dtype)
    return jax.lax.ragged_all_to_all(x, out, input_offsets, send_sizes, output_offsets, recv_sizes,
                                     axis_name=axis_name)


def _exchange_dense(x, counts, out_rows, axis_name):
    """`_exchange_ragged` from a dense all_to_all: each destination's rows are packed into a [cap, ...] slot
    (cap = the most one pair can exchange: min(operand rows, output rows)), sent tiled, and the received slots
    gathered into the output at each source's offset; unwritten rows are zero."""
    p, m = counts.shape[0], x.shape[0]
    cap = min(m, out_rows)
    input_offsets, send_sizes, _, recv_offsets, recv_sizes = exchange_plan(counts, jax.lax.axis_index(axis_name))
    r = jnp.arange(cap)
    src = jnp.clip(input_offsets[:, None] + r[None, :], 0, m - 1)                         # [P, cap]
    slots = jnp.where((r[None, :] < send_sizes[:, None]).reshape((p, cap) + (1,) * (x.ndim - 1)), x[src], 0)
    got = jax.lax.all_to_all(slots.reshape((p * cap,) + x.shape[1:]), axis_name, 0, 0, tiled=True)
    i = jnp.arange(out_rows)
    s = jnp.searchsorted(jnp.cumsum(recv_sizes), i, side="right")                       # source of output row i
    valid = s < p
    s = jnp.minimum(s, p - 1)
    row = s * cap + jnp.clip(i - recv_offsets[s], 0, cap - 1)
    return jnp.where(valid.reshape((out_rows,) + (1,) * (x.ndim - 1)), got[row], 0)


def _exchange(x, counts, out_rows, axis_name):
    impl = _exchange_ragged if target_platform() in ("tpu", "gpu", "cuda", "rocm") else _exchange_dense
    return impl(x, counts, out_rows, axis_name)


@partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def ragged_exchange(x: jax.Array, counts: jax.Array, out_rows: int, axis_name: str) -> jax.Array:
    """Ragged all-to-all over `axis_name` inside `shard_map`: device s sends rows
    x[input_offsets[d] : input_offsets[d] + counts[s, d]] (x packed by destination d) to device d, which writes
    them, sources in order, from row sum_{s' < s} counts[s', d] of a zero [out_rows, ...] output.
    `jax.lax.ragged_all_to_all` on TPU/GPU, a dense `all_to_all` equivalent on CPU (`_exchange_dense`).

    Args:
        x: [M, ...] packed by destination (rows past sum(counts[me]) are not sent).
        counts: [P, P] int32, the same on every device of the axis. out_rows: static output rows, at least
        sum(counts[:, me]) on every device. axis_name: the mesh axis.
    Returns:
        [out_rows, ...]: received rows packed by source, zeros after them.
    Gradient: the reverse exchange (`counts.T`) of the output's cotangent back into [M, ...].
    """
    return _exchange(x, counts, out_rows, axis_name)


def _ragged_exchange_fwd(x, counts, out_rows, axis_name):
    return _exchange(x, counts, out_rows, axis_name), (counts, x.shape[0])


def _ragged_exchange_bwd(out_rows, axis_name, res, g):
    counts, in_rows = res
    return _exchange(g, counts.T, in_rows, axis_name), None


ragged_exchange.defvjp(_ragged_exchange_fwd, _ragged_exchange_bwd)


def _segment_gather(sizes_from: jax.Array, sizes_to: jax.Array, perm_to_from, rows: int) -> jax.Array:
    """Source row, in a layout of segments `sizes_from` [S] (then padding), of each row of a layout holding the
    same segments reordered as `sizes_to` [S] (segment t of it is segment perm_to_from[t] of the first); rows
    past the segments map to themselves (both layouts end with the same padding)."""
    start_from = _exclusive_cumsum(sizes_from)
    ends_to = jnp.cumsum(sizes_to)
    j = jnp.arange(rows)
    t = jnp.searchsorted(ends_to, j, side="right")
    tc = jnp.minimum(t, sizes_to.shape[0] - 1)
    src = start_from[perm_to_from[tc]] + j - (ends_to[tc] - sizes_to[tc])
    return jnp.where(t < sizes_to.shape[0], src, j).astype(jnp.int32)


def received_to_grouped(per_source: jax.Array, rows: int):
    """The permutation from the received layout (sources in order, each source's rows sorted by local expert)
    to the grouped layout (local experts in order, each expert's rows by source), as gathers (no sort).

    Args:
        per_source: [P, El] int32 rows received from each source for each local expert. rows: buffer rows.
    Returns:
        (order, inverse) [rows] int32: grouped = received[order], received = grouped[inverse].
    """
    p, el = per_source.shape
    a = per_source.reshape(-1)                                    # segment (s, e) at s * el + e
    b = per_source.T.reshape(-1)                                  # segment (e, s) at e * p + s
    seg = jnp.arange(p * el)
    b_to_a = (seg % p) * el + seg // p                            # segment e*p+s of b is s*el+e of a
    a_to_b = (seg % el) * p + seg // el
    return _segment_gather(a, b, b_to_a, rows), _segment_gather(b, a, a_to_b, rows)


def _gather_weight(w: jax.Array, spec) -> jax.Array:
    """All-gathers a weight's dimensions after the first (the experts) over their mesh axes (FSDP/tensor)."""
    for dim, entry in enumerate(tuple(spec)[1:], start=1):
        if entry is not None:
            w = jax.lax.all_gather(w, entry, axis=dim, tiled=True)
    return w


def _exchange_ffn(grouped_ffn, row_multiple, x, expert_ids, gate_up, down):
    """Steps 1-5 on one device's rows (inside shard_map): x [n, H], expert_ids [n, k] (global ids), gate_up
    [El, H, 2I], down [El, I, H] (this device's experts, gathered over fsdp/tensor) -> [n, k, H]."""
    p = jax.lax.axis_size(EXPERT_AXIS)
    me = jax.lax.axis_index(EXPERT_AXIS)
    el = gate_up.shape[0]
    m = expert_ids.size
    rows, flat, unsort = sorted_assignments(x, expert_ids)                 # [m, H], by expert = by destination
    sizes = jnp.bincount(flat, length=el * p).astype(jnp.int32)            # [E]
    per = jax.lax.all_gather(sizes, EXPERT_AXIS).reshape(p, p, el)         # [source, destination, local expert]
    counts = jnp.sum(per, axis=-1)                                         # [P, P]
    cap = -(-p * m // row_multiple) * row_multiple                         # dropless worst case: every row here
    received = ragged_exchange(rows, counts, cap, EXPERT_AXIS)             # [cap, H] by source
    mine = jnp.take(per, me, axis=1)                                       # [P, El] received per source, expert
    order, inverse = received_to_grouped(mine, cap)
    y = grouped_ffn(permute_rows(received, order, inverse), jnp.sum(mine, axis=0), gate_up, down)
    y = jnp.where((jnp.arange(cap) < jnp.sum(mine))[:, None], y, 0)        # rows past the groups: undefined
    back = ragged_exchange(permute_rows(y, inverse, order), counts.T, m, EXPERT_AXIS)   # [m, H] sorted order
    return unsort(back)


def _expert_shard(grouped_ffn, row_multiple, gate_up_spec, down_spec, x, expert_ids, gate_up, down):
    """One device's part of `expert_parallel_ffn` (inside shard_map): x [n, H], expert_ids [n, k] (global ids),
    gate_up [El, H/f, 2I/t], down [El, I/t, H/f] (this device's experts) -> [n, k, H]."""
    gate_up, down = _gather_weight(gate_up, gate_up_spec), _gather_weight(down, down_spec)
    return _exchange_ffn(grouped_ffn, row_multiple, x, expert_ids, gate_up, down)


def _combined_exchange_ffn(grouped_ffn, row_multiple, x, expert_ids, weights, gate_up, down):
    """`_exchange_ffn` with each token's k outputs summed by its routing weights [n, k] -> [n, H]."""
    return jnp.einsum("nkh,nk->nh", _exchange_ffn(grouped_ffn, row_multiple, x, expert_ids, gate_up, down), weights)


def _chunked_expert_shard(grouped_ffn, row_multiple, token_chunk, gate_up_spec, down_spec, x, expert_ids, weights,
                          gate_up, down):
    """One device's part of `expert_parallel_ffn` with `token_chunk`: the weights gathered once, then steps 1-5
    and the weighted sum over the k slots per chunk of `token_chunk` rows (`scan_row_chunks`) -> [n, H]."""
    gate_up, down = _gather_weight(gate_up, gate_up_spec), _gather_weight(down, down_spec)
    return scan_row_chunks(partial(_combined_exchange_ffn, grouped_ffn, row_multiple), token_chunk,
                           (x, expert_ids, weights), (gate_up, down))


def check_expert_axis(num_experts: int, mesh_shape: dict[str, int]) -> int:
    """The 'expert' axis size P of a mesh shape ({axis: size}; 1 without the axis).

    Raises:
        ValueError: P does not divide num_experts (naming both).
    """
    p = mesh_shape.get(EXPERT_AXIS, 1)
    if num_experts % p:
        raise ValueError(f"expert parallelism: the mesh's 'expert' axis (size {p}) does not divide "
                         f"num_experts ({num_experts}); use an expert axis that divides {num_experts}")
    return p


def expert_parallel_ffn(grouped_ffn, x: jax.Array, expert_ids: jax.Array, gate_up: jax.Array, down: jax.Array,
                        row_multiple: int = 1, weights: jax.Array | None = None,
                        token_chunk: int | None = None) -> jax.Array:
    """SwiGLU experts by expert parallelism over the mesh in context (module docstring).

    Args:
        grouped_ffn: (rows [R, H] sorted by local expert, sizes [El] int32, gate_up [El, H, 2I], down [El, I, H])
            -> [R, H]; rows past sum(sizes) may come out undefined (they are masked).
        x: [N, H] compute dtype. expert_ids: [N, k] int32 in [0, E). gate_up: [E, H, 2I]. down: [E, I, H].
        row_multiple: the receive buffer's rows are a multiple of this (megablox: its row tile).
        weights: optional [N, k] routing weights: the result is then each token's weighted sum over its k slots.
        token_chunk: with `weights`, each device runs the dispatch on chunks of this many of its own rows in a
            rematerialised scan (`scan_row_chunks`: exchange buffers of a chunk, P * token_chunk * k rows,
            instead of P * n * k); None: all its rows at once.
    Returns:
        [N, k, H]: each (token, slot)'s expert output, unweighted, equal to the single-device dispatch; with
        `weights`, [N, H] = sum_k weights[:, k] * that.
    Raises:
        ValueError: no mesh with an 'expert' axis of size > 1 in context, or one that does not divide E; a
            token_chunk without weights.
    """
    mesh_shape = active_mesh_shape()
    if check_expert_axis(gate_up.shape[0], mesh_shape) == 1:
        raise ValueError(f"expert_parallel_ffn needs a mesh with an 'expert' axis > 1 in context, got {mesh_shape}")
    if token_chunk is not None and weights is None:
        raise ValueError("expert_parallel_ffn: token_chunk needs the routing weights (the chunks combine their slots)")
    row_axes = tuple(a for a in ROW_AXES if mesh_shape.get(a, 1) > 1)
    rows = (x, expert_ids) if weights is None else (x, expert_ids, weights)
    n, pad = x.shape[0], -x.shape[0] % math.prod(mesh_shape[a] for a in row_axes)
    if pad:  # padding rows (routed to expert 0, weight 0) make the rows split evenly; dropped after
        rows = tuple(jnp.pad(r, ((0, pad), (0, 0))) for r in rows)
    split = jax.sharding.PartitionSpec(row_axes)
    gate_up_spec = fitted_spec(gate_up.shape, ("expert", "expert_embed", "mlp"), mesh_shape)
    down_spec = fitted_spec(down.shape, ("expert", "mlp", "expert_embed"), mesh_shape)
    if weights is None:
        body = partial(_expert_shard, grouped_ffn, row_multiple, gate_up_spec, down_spec)
    else:
        body = partial(_chunked_expert_shard, grouped_ffn, row_multiple, token_chunk, gate_up_spec, down_spec)
    out = jax.shard_map(body, in_specs=(split,) * len(rows) + (gate_up_spec, down_spec), out_specs=split,
                        check_vma=False)(*rows, gate_up.astype(x.dtype), down.astype(x.dtype))
    return out[:n] if pad else out
