"""Partial rotary position embedding, NeoX (`rotate_half`) layout, as in qwen3_5_moe.

Only the first `rotary_dim = head_dim * partial_rotary_factor` channels of each head rotate; the rest pass
through. Text positions use identical (T, H, W) rows, for which transformers' interleaved mRoPE reduces
exactly to this 1-D RoPE (transformers `Qwen3_5MoeTextRotaryEmbedding`, `apply_rotary_pos_emb`).
"""

import jax
import jax.numpy as jnp


def rope_cos_sin(positions: jax.Array, rotary_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """cos and sin tables.

    Args:
        positions: [B, T] int32 token positions.
        rotary_dim: even number of rotated channels.
        theta: RoPE base.
    Returns:
        (cos, sin), each [B, T, rotary_dim] float32, laid out as `cat(freqs, freqs)`.
    """
    inv_freq = 1.0 / (theta ** (jnp.arange(0, rotary_dim, 2, dtype=jnp.float32) / rotary_dim))
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def apply_partial_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotates the first `cos.shape[-1]` channels of every head (NeoX rotate_half).

    Args:
        x: [B, T, N, D] queries or keys.
        cos, sin: [B, T, R] from `rope_cos_sin`, R <= D, R even.
    Returns:
        [B, T, N, D] in x.dtype. As in transformers, cos/sin are cast to x.dtype first.
    """
    r = cos.shape[-1]
    cos = cos[:, :, None, :].astype(x.dtype)
    sin = sin[:, :, None, :].astype(x.dtype)
    x_rot, x_pass = x[..., :r], x[..., r:]
    x1, x2 = x_rot[..., : r // 2], x_rot[..., r // 2 :]
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return jnp.concatenate([x_rot * cos + rotated * sin, x_pass], axis=-1)
