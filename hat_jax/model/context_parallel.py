"""Context parallelism: the sequence of the [B, T, ...] activations split over the mesh's 'context' axis.

With a 'context' axis of P > 1 devices each device holds T / P consecutive tokens of its rows (shard i holds
tokens [i T/P, (i+1) T/P)). Token-local work (projections, norms, the MoE, the losses) runs on each device's
tokens under GSPMD: the activations are constrained to ("batch", "length", ...) and the weights, stored
sharded over 'context' too, are gathered as FSDP gathers them. The two sequence mixers are explicit
`jax.shard_map`s over the batch axes and 'context' (`map_sequence_shards`):
- full attention (`hat_jax.model.attention_impls.context_parallel_attention`): each device keeps its queries and
  all-gathers the keys, values and key segment ids (`gather_sequence`); its queries sit at key slot
  i T/P (`shard_start`). This is the all-gather form of context parallelism (MaxText's, Llama 3's),
  not the ring form;
- Gated DeltaNet (`hat_jax.model.deltanet`): the causal conv reads the previous shard's last K-1 inputs (a
  halo, `from_previous_shard`); the recurrence runs P passes, each starting from the state the previous shard
  ended its last pass with, so after pass P every shard started from the exact state (P times the recurrence's
  FLOPs, a few percent of a layer's at P = 2).
Without a 'context' axis (or of size 1) none of this runs and the model is unchanged.
"""

from __future__ import annotations

import jax
from jax.sharding import PartitionSpec

from hat_jax.model.sharding import active_mesh_shape, fitted_spec

CONTEXT_AXIS = "context"


def context_size() -> int:
    """P, the size of the 'context' axis of the mesh in context (1 without a mesh or without the axis)."""
    return active_mesh_shape().get(CONTEXT_AXIS, 1)


def sequence_spec(shape) -> PartitionSpec:
    """The shard_map spec of a [B, T, ...] activation under the mesh in context: rows over the batch axes that
    divide B (`fitted_spec`), the sequence over 'context', the rest whole."""
    return PartitionSpec(fitted_spec(shape[:1], ("batch",), active_mesh_shape())[0], CONTEXT_AXIS)


def check_sequence_split(t: int, what: str, minimum: int = 1) -> int:
    """T / P for a sequence of `t` tokens on the mesh in context.

    Raises:
        ValueError: P does not divide t, or a shard would hold fewer than `minimum` tokens (names `what`).
    """
    p = context_size()
    if t % p or t // p < minimum:
        raise ValueError(f"context parallelism: {what} has {t} tokens, which the mesh's 'context' axis "
                         f"(size {p}) must split into shards of at least {minimum} tokens")
    return t // p


def map_sequence_shards(fn, seq_args, shared=()):
    """`fn(*seq_args_local, *shared)` on each device's rows and sequence shard (a `jax.shard_map` over every
    mesh axis: `sequence_spec` for `seq_args`, `shared` replicated); fn may use `from_previous_shard`,
    `gather_sequence` and `shard_start`, and returns one array or a tuple of arrays shaped [B_local, T / P, ...].

    Args:
        fn: the per-shard function. seq_args: [B, T, ...] arrays (same B and T). shared: arrays every shard
            sees whole.
    Returns:
        fn's result as global [B, T, ...] arrays.
    Raises:
        ValueError from `check_sequence_split`.
    """
    check_sequence_split(seq_args[0].shape[1], "an activation")
    spec = sequence_spec(seq_args[0].shape)
    return jax.shard_map(fn, in_specs=(spec,) * len(seq_args) + (PartitionSpec(),) * len(shared),
                         out_specs=spec, check_vma=False)(*seq_args, *shared)


def from_previous_shard(x: jax.Array) -> jax.Array:
    """Inside `map_sequence_shards`: shard i's result is shard i-1's `x` (a ppermute along 'context'); shard 0
    gets zeros."""
    p = jax.lax.axis_size(CONTEXT_AXIS)
    return jax.lax.ppermute(x, CONTEXT_AXIS, [(i, i + 1) for i in range(p - 1)])


def gather_sequence(x: jax.Array) -> jax.Array:
    """Inside `map_sequence_shards`: [B, T / P, ...] -> [B, T, ...], every shard's tokens in order (an
    all-gather along 'context'; its transpose, in the backward pass, is a reduce-scatter)."""
    return jax.lax.all_gather(x, CONTEXT_AXIS, axis=1, tiled=True)


def shard_start(local_len: int) -> jax.Array:
    """Inside `map_sequence_shards`: the global index of this shard's first token, int32 scalar."""
    return jax.lax.axis_index(CONTEXT_AXIS) * local_len


def is_first_shard() -> jax.Array:
    """Inside `map_sequence_shards`: whether this device holds the sequence's first shard, bool scalar."""
    return jax.lax.axis_index(CONTEXT_AXIS) == 0
