"""Gated full attention of qwen3_5_moe (transformers `Qwen3_5MoeAttention`).

- `q_proj` produces, per head, a query and an output gate *interleaved per head*: the [H*2*D] output is
  viewed as [H, 2, D] (query first), not split into two halves of rows.
- Zero-centred RMSNorm on q and k per head (QK-norm), then partial NeoX RoPE.
- Grouped-query attention: query head h uses KV head h // (H / KV).
- Softmax in float32 with scale D**-0.5, cast back to the compute dtype (as transformers' eager path).
- Output `o_proj(attn * sigmoid(gate))`.

Masking uses a boolean [B, T, S] mask built once per forward by the caller (causal and padding); masked
scores get the dtype's most negative finite value, so a fully masked (padding) row gives a finite output.
With a cache, keys/values of the T new tokens are written at slot `index` of a fixed-size [B, S, KV, D]
buffer.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from hat_jax.model.config import Qwen3_5MoeTextConfig
from hat_jax.model.linear import Linear
from hat_jax.model.norms import RMSNorm
from hat_jax.model.rope import apply_partial_rope


def gqa_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float) -> jax.Array:
    """Masked softmax attention with grouped KV heads.

    Args:
        q: [B, T, H, D]; k, v: [B, S, KV, D] with H % KV == 0; mask: [B, T, S] bool (True = may attend).
        scale: multiplier of the scores.
    Returns:
        [B, T, H, D] in q.dtype.
    """
    b, t, h, d = q.shape
    kv = k.shape[2]
    qg = q.reshape(b, t, kv, h // kv, d)
    scores = jnp.einsum("btkgd,bskd->bkgts", qg, k) * scale
    scores = jnp.where(mask[:, None, None, :, :], scores, jnp.finfo(scores.dtype).min)
    probs = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(q.dtype)
    out = jnp.einsum("bkgts,bskd->btkgd", probs, v)
    return out.reshape(b, t, h, d)


class GatedAttention(nn.Module):
    """Gated full-attention token mixer. Params: q_proj, k_proj, v_proj, o_proj, q_norm, k_norm."""

    config: Qwen3_5MoeTextConfig
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x, cos, sin, mask, cache=None, index=None):
        """
        Args:
            x: [B, T, hidden] compute dtype.
            cos, sin: [B, T, rotary_dim] from `rope_cos_sin`.
            mask: [B, T, S] bool, S = T without cache, S = cache length with one.
            cache: None or {'k': [B, S, KV, D], 'v': [B, S, KV, D]}.
            index: int32 scalar, the cache slot of the first new token (with a cache).
        Returns:
            (y [B, T, hidden], new cache or None).
        """
        c = self.config
        b, t, _ = x.shape
        h, kv, d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        dense = lambda n, feats, axes: Linear(feats, axes, self.dtype, self.param_dtype, c.initializer_range, name=n)
        qg = dense("q_proj", h * 2 * d, ("embed", "heads"))(x).reshape(b, t, h, 2, d)
        q, gate = qg[:, :, :, 0], qg[:, :, :, 1].reshape(b, t, h * d)
        k = dense("k_proj", kv * d, ("embed", "kv_heads"))(x).reshape(b, t, kv, d)
        v = dense("v_proj", kv * d, ("embed", "kv_heads"))(x).reshape(b, t, kv, d)
        q = RMSNorm(c.rms_norm_eps, self.param_dtype, name="q_norm")(q)
        k = RMSNorm(c.rms_norm_eps, self.param_dtype, name="k_norm")(k)
        q = apply_partial_rope(q, cos, sin)
        k = apply_partial_rope(k, cos, sin)
        new_cache = None
        if cache is not None:
            k_all = jax.lax.dynamic_update_slice(cache["k"], k.astype(cache["k"].dtype), (0, index, 0, 0))
            v_all = jax.lax.dynamic_update_slice(cache["v"], v.astype(cache["v"].dtype), (0, index, 0, 0))
            new_cache = {"k": k_all, "v": v_all}
            k, v = k_all.astype(self.dtype), v_all.astype(self.dtype)
        out = gqa_attention(q, k, v, mask, d**-0.5).reshape(b, t, h * d)
        out = out * jax.nn.sigmoid(gate)
        return dense("o_proj", c.hidden_size, ("heads", "embed"))(out), new_cache
