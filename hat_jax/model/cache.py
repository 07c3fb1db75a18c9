"""Decoding cache: KV buffers for full-attention layers, conv + recurrent state for Gated DeltaNet layers.

Layout (a plain pytree, so it can be jitted, donated and sharded):
    {'index': int32 scalar      number of slots written so far (the same for every row),
     'valid': [B, S] bool       which slots hold real tokens (False for left padding and unwritten slots),
     'layers': [per layer:
         full attention: {'k': [B, S, KV, D], 'v': [B, S, KV, D]}       compute dtype
         Gated DeltaNet: {'conv': [B, K-1, conv_dim]  compute dtype,  the last K-1 conv inputs
                          'state': [B, Hv, Dk, Dv] float32,          the delta-rule state}]}
Under a mesh (`hat_jax.model.sharding.mesh_context`) every array is split by rows over the batch axes, as
the activations are, so each device holds the KV and DeltaNet state of its own rows only.
Rows of different prompt lengths are left-padded; the model derives each row's positions from `valid`.
Left padding never reaches the DeltaNet state: its inputs are zeroed, so conv inputs are zero and the
state stays exactly 0 until the first real token, and a padded row decodes exactly as it would alone.
(Padding *after* real tokens is different: the state still decays there and the conv shifts in zeros,
as in transformers; the sampler therefore only masks rows once they have finished.)
"""

import jax
import jax.numpy as jnp

from hat_jax.model.config import FULL_ATTENTION, Qwen3_5MoeTextConfig
from hat_jax.model.sharding import constrain


def _rows(shape, dtype, logical) -> jax.Array:
    """Zeros split by rows (and `logical`'s other axes) over the mesh in context."""
    return constrain(jnp.zeros(shape, dtype), ("batch",) + logical)


def init_cache(config: Qwen3_5MoeTextConfig, batch: int, max_len: int, dtype=jnp.float32) -> dict:
    """An empty cache for `batch` rows and `max_len` slots (prompt + generated tokens), its arrays split by rows
    under a mesh (module docstring)."""
    c = config
    layers = []
    for layer_type in c.layer_types:
        if layer_type == FULL_ATTENTION:
            shape = (batch, max_len, c.num_key_value_heads, c.head_dim)
            layers.append({"k": _rows(shape, dtype, (None, "kv_heads", None)),
                           "v": _rows(shape, dtype, (None, "kv_heads", None))})
        else:
            layers.append({
                "conv": _rows((batch, c.linear_conv_kernel_dim - 1, c.linear_conv_dim), dtype,
                              (None, "linear_qkv")),
                "state": _rows((batch, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim),
                               jnp.float32, ("linear_heads", None, None)),
            })
    return {"index": jnp.zeros((), jnp.int32), "valid": _rows((batch, max_len), bool, (None,)), "layers": layers}


def check_cache_room(cache: dict, num_tokens: int) -> None:
    """Raises when writing `num_tokens` slots at `cache["index"]` would pass the cache's end.

    `jax.lax.dynamic_update_slice` clamps its start index, so such a write would silently overwrite the last
    slots. Checked whenever the index is concrete (an eager call, or the static index 0 of a prefill); inside a
    jitted loop the index is traced and the caller sizes the cache (`generate` allocates prompt + max_new_tokens
    slots and writes at most that many).

    Args:
      cache: from `init_cache` ('valid' [B, S]; 'index' int32 scalar or Python int). num_tokens: slots to write.
    Raises:
      ValueError: index + num_tokens > S (names the three numbers).
    """
    capacity = cache["valid"].shape[1]
    index = cache["index"]
    if isinstance(index, jax.core.Tracer):
        if num_tokens > capacity:
            raise ValueError(f"decode cache: {num_tokens} new tokens do not fit its {capacity} slots")
        return
    start = int(index)
    if start + num_tokens > capacity:
        raise ValueError(f"decode cache is full: writing {num_tokens} token(s) at slot {start} needs "
                         f"{start + num_tokens} slots, the cache has {capacity} (init_cache(max_len=...) too small)")


def cache_positions(valid: jax.Array, index, num_tokens: int) -> jax.Array:
    """Positions of the `num_tokens` tokens at slots index .. index + num_tokens - 1: the number of valid slots
    before each (valid [B, S] bool with the new tokens' mask already written) -> [B, T] int32. Invalid slots
    (left padding, rejected speculative drafts) take no position."""
    slots = index + jnp.arange(num_tokens)
    return jnp.maximum(jnp.take(jnp.cumsum(valid, axis=1) - 1, slots, axis=1), 0)
