"""Decoding cache: KV buffers for full-attention layers, conv + recurrent state for Gated DeltaNet layers.

Layout (a plain pytree, so it can be jitted, donated and sharded):
    {'index': int32 scalar      number of slots written so far (the same for every row),
     'valid': [B, S] bool       which slots hold real tokens (False for left padding and unwritten slots),
     'layers': [per layer:
         full attention: {'k': [B, S, KV, D], 'v': [B, S, KV, D]}       compute dtype
         Gated DeltaNet: {'conv': [B, K-1, conv_dim]  compute dtype,  the last K-1 conv inputs
                          'state': [B, Hv, Dk, Dv] float32,          the delta-rule state}]}
Rows of different prompt lengths are left-padded; the model derives each row's positions from `valid`.
Left padding never reaches the DeltaNet state: its inputs are zeroed, so conv inputs are zero and the
state stays exactly 0 until the first real token, and a padded row decodes exactly as it would alone.
(Padding *after* real tokens is different: the state still decays there and the conv shifts in zeros,
as in transformers; the sampler therefore only masks rows once they have finished.)
"""

import jax.numpy as jnp

from hat_jax.model.config import FULL_ATTENTION, Qwen3_5MoeTextConfig


def init_cache(config: Qwen3_5MoeTextConfig, batch: int, max_len: int, dtype=jnp.float32) -> dict:
    """An empty cache for `batch` rows and `max_len` slots (prompt + generated tokens)."""
    c = config
    layers = []
    for layer_type in c.layer_types:
        if layer_type == FULL_ATTENTION:
            shape = (batch, max_len, c.num_key_value_heads, c.head_dim)
            layers.append({"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)})
        else:
            layers.append({
                "conv": jnp.zeros((batch, c.linear_conv_kernel_dim - 1, c.linear_conv_dim), dtype),
                "state": jnp.zeros((batch, c.linear_num_value_heads, c.linear_key_head_dim,
                                    c.linear_value_head_dim), jnp.float32),
            })
    return {"index": jnp.zeros((), jnp.int32), "valid": jnp.zeros((batch, max_len), bool), "layers": layers}
