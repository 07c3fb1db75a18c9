"""Gated full attention of qwen3_5_moe (transformers `Qwen3_5MoeAttention`).

- `q_proj` produces, per head, a query and an output gate *interleaved per head*: the [H*2*D] output is
  viewed as [H, 2, D] (query first), not split into two halves of rows.
- Zero-centred RMSNorm on q and k per head (QK-norm), then partial NeoX RoPE.
- Grouped-query attention: query head h uses KV head h // (H / KV).
- Softmax in float32 with scale D**-0.5, cast back to the compute dtype (as transformers' eager path).
- Output `o_proj(attn * sigmoid(gate))`.

Masking comes from segment ids and causality only, built inside `attention` (the entry point, shaped
like splash attention's `SegmentIds` so that a fused kernel can take the same arguments): query t may
attend key s when both are in the same segment, the key is not padding (segment 0) and, causally,
s <= q_offset + t. Packed rows give each document its own id; an unpacked row puts every query in
segment 1 and its keys in segment 1 (real) or 0 (padding), which is the plain causal + padding mask.
Masked scores get the dtype's most negative finite value, so a fully masked row gives a finite output.
With a cache, keys/values of the T new tokens are written at slot `index` of a fixed-size [B, S, KV, D]
buffer. When the query offset is static (no cache, or a cache with a static `index`),
`causal_gqa_attention` computes the same result in query blocks that skip the masked upper triangle.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from hat_jax.model.config import Qwen3_5MoeTextConfig
from hat_jax.model.linear import Linear
from hat_jax.model.norms import RMSNorm
from hat_jax.model.rope import apply_partial_rope


ATTENTION_BLOCK = 128  # query rows per block of `causal_gqa_attention`
MAX_ATTENTION_BLOCKS = 16  # longer sequences get larger blocks (the block loop is unrolled at trace time)


def segment_mask(q_segment_ids: jax.Array, kv_segment_ids: jax.Array, causal: bool = True,
                 q_offset: int | jax.Array = 0) -> jax.Array:
    """The attention mask of segment ids (module docstring).

    Args:
        q_segment_ids: [B, T] int; kv_segment_ids: [B, S] int (0 = padding key).
        causal: also require s <= q_offset + t. q_offset: int or int32 scalar, the key slot of query 0.
    Returns:
        [B, T, S] bool (True = may attend).
    """
    mask = (q_segment_ids[:, :, None] == kv_segment_ids[:, None, :]) & (kv_segment_ids[:, None, :] != 0)
    if causal:
        t, s = q_segment_ids.shape[1], kv_segment_ids.shape[1]
        mask &= jnp.arange(s)[None, None, :] <= (q_offset + jnp.arange(t))[None, :, None]
    return mask


def attention(q: jax.Array, k: jax.Array, v: jax.Array, q_segment_ids: jax.Array, kv_segment_ids: jax.Array, *,
              scale: float, causal: bool = True, q_offset: int | jax.Array = 0) -> jax.Array:
    """Softmax attention with grouped KV heads, masked by segment ids (and causality): the entry point.

    Picks the implementation: one query (a decode step) -> `_single_query_attention`; causal with a static
    `q_offset` -> `causal_gqa_attention` (skips the upper triangle); otherwise `gqa_attention` on
    `segment_mask`. All give the same result.

    Args:
        q: [B, T, H, D]; k, v: [B, S, KV, D] with H % KV == 0.
        q_segment_ids: [B, T] int32; kv_segment_ids: [B, S] int32 (0 = padding key; module docstring).
        scale: multiplier of the scores. causal: mask keys after the query's slot.
        q_offset: key slot of query 0 (the cache index); a Python int allows the causal block path.
    Returns:
        [B, T, H, D] in q.dtype.
    """
    if q.shape[1] > 1 and causal and isinstance(q_offset, int):
        return causal_gqa_attention(q, k, v, q_segment_ids, kv_segment_ids, scale, q_offset)
    return gqa_attention(q, k, v, segment_mask(q_segment_ids, kv_segment_ids, causal, q_offset), scale)


def _to_heads_major(q: jax.Array, k: jax.Array, v: jax.Array):
    """[B, T, H, D], [B, S, KV, D] x2 -> [B, KV, G, T, D], [B, KV, S, D] x2 (G = H / KV)."""
    b, t, h, d = q.shape
    kv = k.shape[2]
    qt = q.reshape(b, t, kv, h // kv, d).transpose(0, 2, 3, 1, 4)
    return qt, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)


def _attend(qt: jax.Array, kt: jax.Array, vt: jax.Array, mask: jax.Array, scale: float) -> jax.Array:
    """qt [B, KV, G, T, D], kt/vt [B, KV, S, D], mask [B, T, S] -> [B, KV, G, T, D] in qt.dtype."""
    scores = jnp.einsum("bkgtd,bksd->bkgts", qt, kt) * scale
    scores = jnp.where(mask[:, None, None, :, :], scores, jnp.finfo(scores.dtype).min)
    probs = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(qt.dtype)
    return jnp.einsum("bkgts,bksd->bkgtd", probs, vt)


def _from_heads_major(out: jax.Array) -> jax.Array:
    """[B, KV, G, T, D] -> [B, T, H, D]."""
    b, kv, g, t, d = out.shape
    return out.transpose(0, 3, 1, 2, 4).reshape(b, t, kv * g, d)


def gqa_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float) -> jax.Array:
    """Masked softmax attention with grouped KV heads.

    Args:
        q: [B, T, H, D]; k, v: [B, S, KV, D] with H % KV == 0; mask: [B, T, S] bool (True = may attend).
        scale: multiplier of the scores.
    Returns:
        [B, T, H, D] in q.dtype.
    """
    if q.shape[1] == 1:
        return _single_query_attention(q, k, v, mask, scale)
    # Heads-major layout ([B, KV, G, T, D] against [B, KV, S, D]): plain batched matmuls, 2-3x faster on
    # XLA:CPU than contracting the [B, T, KV, G, D] layout directly.
    return _from_heads_major(_attend(*_to_heads_major(q, k, v), mask, scale))


def _single_query_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float) -> jax.Array:
    """`gqa_attention` for T = 1 (a decode step) as multiply-and-reduce fusions over the [B, S, KV, D] cache
    as stored: a dot would first transpose the whole cache, a copy per layer and step (measured in the
    sampler's decode loop: ~15% of a step of the tiny preset)."""
    b, _, h, d = q.shape
    kv = k.shape[2]
    qg = q.reshape(b, 1, kv, h // kv, d)
    # sums accumulate in float32 (as the dots of the other paths do on CPU)
    scores = jnp.sum(qg * k[:, :, :, None, :], axis=-1, dtype=jnp.float32) * scale  # [B, S, KV, G]
    scores = jnp.where(mask[:, 0, :, None, None], scores, jnp.finfo(scores.dtype).min)
    probs = jax.nn.softmax(scores, axis=1).astype(q.dtype)
    out = jnp.sum(probs[..., None] * v[:, :, :, None, :], axis=1, dtype=jnp.float32)  # [B, KV, G, D]
    return out.astype(q.dtype).reshape(b, 1, h, d)


def causal_gqa_attention(q: jax.Array, k: jax.Array, v: jax.Array, q_segment_ids: jax.Array,
                         kv_segment_ids: jax.Array, scale: float, offset: int = 0,
                         block: int | None = None) -> jax.Array:
    """`gqa_attention` on `segment_mask(q_segment_ids, kv_segment_ids, causal=True, q_offset=offset)`,
    computed without the masked upper triangle (queries are the keys' slots offset .. offset + T - 1, as in
    a prefill or a training forward).

    Queries go in blocks of `block` rows (more when T > MAX_ATTENTION_BLOCKS * block); block [i, e)
    attends keys [0, offset + e) only, which skips ~half of the score matrix. The keys it leaves out are
    masked for that block, and a masked key gets probability exactly 0 in `gqa_attention` unless the
    whole row is masked; such a row (a padding query, or a query with no real key of its segment before
    it) gets there the uniform average of all S values, which is reproduced here.

    Args:
        q: [B, T, H, D]; k, v: [B, S, KV, D], S >= offset + T.
        q_segment_ids: [B, T] int; kv_segment_ids: [B, S] int (0 = padding key).
        scale: multiplier of the scores. offset: static int, slot of the first query.
        block: query rows per block (default ATTENTION_BLOCK).
    Returns:
        [B, T, H, D] in q.dtype.
    Raises:
        ValueError when offset + T exceeds S.
    """
    t, s = q.shape[1], k.shape[1]
    if offset + t > s:
        raise ValueError(f"causal_gqa_attention: offset {offset} + T {t} exceeds the {s} keys")
    block = max(block or ATTENTION_BLOCK, -(-t // MAX_ATTENTION_BLOCKS))
    qt, kt, vt = _to_heads_major(q, k, v)
    outs, any_key = [], []
    for i in range(0, t, block):
        e = min(i + block, t)
        end = offset + e
        mask = segment_mask(q_segment_ids[:, i:e], kv_segment_ids[:, :end], True, offset + i)
        outs.append(_attend(qt[:, :, :, i:e], kt[:, :, :end], vt[:, :, :end], mask, scale))
        any_key.append(jnp.any(mask, axis=-1))
    out = _from_heads_major(jnp.concatenate(outs, axis=3))
    fully_masked = ~jnp.concatenate(any_key, axis=1)                                # [B, T]
    b, _, h, d = q.shape
    kv = k.shape[2]
    mean_v = jnp.mean(v.astype(jnp.float32), axis=1).astype(q.dtype)              # [B, KV, D]
    mean_v = jnp.repeat(mean_v, h // kv, axis=1)[:, None]                           # [B, 1, H, D]
    return jnp.where(fully_masked[:, :, None, None], mean_v, out)


class GatedAttention(nn.Module):
    """Gated full-attention token mixer. Params: q_proj, k_proj, v_proj, o_proj, q_norm, k_norm."""

    config: Qwen3_5MoeTextConfig
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x, cos, sin, q_segment_ids, kv_segment_ids, cache=None, index=None):
        """
        Args:
            x: [B, T, hidden] compute dtype.
            cos, sin: [B, T, rotary_dim] from `rope_cos_sin`.
            q_segment_ids: [B, T] int32; kv_segment_ids: [B, S] int32, S = T without cache, S = cache length
                with one (`attention`; attention is causal within a segment).
            cache: None or {'k': [B, S, KV, D], 'v': [B, S, KV, D]}.
            index: int32 scalar, the cache slot of the first new token (with a cache); a static Python int
                lets a multi-token call skip the masked upper triangle (`causal_gqa_attention`).
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
        # Query t sits at key slot offset + t: 0 without a cache, the cache index with one (a static int for
        # the sampler's prefill, which then skips the masked upper triangle).
        offset = 0 if cache is None else index
        out = attention(q, k, v, q_segment_ids, kv_segment_ids, scale=d**-0.5, causal=True, q_offset=offset)
        out = out.reshape(b, t, h * d)
        out = out * jax.nn.sigmoid(gate)
        return dense("o_proj", c.hidden_size, ("heads", "embed"))(out), new_cache
