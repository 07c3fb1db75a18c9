"""Gated full attention of qwen3_5_moe (transformers `Qwen3_5MoeAttention`).

- `q_proj` produces, per head, a query and an output gate *interleaved per head*: the [H*2*D] output is
  viewed as [H, 2, D] (query first), not split into two halves of rows.
- Zero-centred RMSNorm on q and k per head (QK-norm), then partial NeoX RoPE.
- Grouped-query attention: query head h uses KV head h // (H / KV).
- Softmax in float32 with scale D**-0.5, cast back to the compute dtype (as transformers' eager path).
- Output `o_proj(attn * sigmoid(gate))`.

The mask comes from segment ids and causality only (`hat_jax.model.attention_impls.segment_mask`). With a
cache, keys/values of the T new tokens are written at slot `index` of a fixed-size [B, S, KV, D] buffer.

`attention` picks the implementation of a call (`ATTENTION_IMPLS`, the model's `attention_impl`; the
implementations are in `hat_jax.model.attention_impls`): 'xla' (exact reference, any backend), 'splash'
(TPU Pallas splash attention), 'cudnn' (`jax.nn.dot_product_attention(implementation="cudnn")`, GPU),
'auto' (splash on TPU, cudnn on GPU, xla elsewhere). The fused ones build no [B, T, S] mask and serve the
uncached forward (q_offset 0, S == T); cached calls (prefill, decode) take 'xla'. Under a mesh with a
'context' axis the uncached forward runs context-parallel (`context_parallel_attention`: each device's
queries against the all-gathered keys and values), with 'xla' or 'splash'.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from hat_jax.model.attention_impls import (causal_gqa_attention, context_parallel_attention, cudnn_attention,
                                           gqa_attention, segment_mask, splash_attention)
from hat_jax.model.config import Qwen3_5MoeTextConfig
from hat_jax.model.context_parallel import context_size
from hat_jax.model.linear import Linear
from hat_jax.model.norms import RMSNorm
from hat_jax.model.rope import apply_partial_rope
from hat_jax.model.sharding import map_row_shards, target_platform


ATTENTION_IMPLS = ("xla", "splash", "cudnn", "auto")


def resolve_attention_impl(impl: str, platform: str | None = None) -> str:
    """'auto' -> 'splash' on TPU, 'cudnn' on GPU, 'xla' elsewhere; other names are checked against the
    platform (default `target_platform()`).

    Raises:
        ValueError naming `attention_impl` for an unknown name, 'splash' off TPU or 'cudnn' off GPU.
    """
    if impl not in ATTENTION_IMPLS:
        raise ValueError(f"attention_impl {impl!r}: expected one of {list(ATTENTION_IMPLS)}")
    if impl == "xla":
        return impl
    platform = platform or target_platform()
    if impl == "auto":
        return {"tpu": "splash", "gpu": "cudnn", "cuda": "cudnn"}.get(platform, "xla")
    if impl == "splash" and platform != "tpu":
        raise ValueError(f"attention_impl 'splash': needs a TPU backend, got {platform!r} (use 'xla' or "
                         "'auto'; tests run the kernel with `splash_attention(..., interpret=True)`)")
    if impl == "cudnn" and platform not in ("gpu", "cuda"):
        raise ValueError(f"attention_impl 'cudnn': needs a GPU backend, got {platform!r} (use 'xla' or 'auto')")
    return impl


def attention(q: jax.Array, k: jax.Array, v: jax.Array, q_segment_ids: jax.Array, kv_segment_ids: jax.Array, *,
              scale: float, causal: bool = True, q_offset: int | jax.Array = 0, impl: str = "xla",
              packed: bool = True) -> jax.Array:
    """Softmax attention with grouped KV heads, masked by segment ids (and causality): the entry point.

    impl 'xla' picks: one query (a decode step) -> `_single_query_attention`; causal with a static
    `q_offset` -> `causal_gqa_attention` (skips the upper triangle); otherwise `gqa_attention` on
    `segment_mask`. All give the same result. 'splash' -> `splash_attention`, 'cudnn' -> `cudnn_attention`,
    'auto' -> `resolve_attention_impl`. A cached call (q_offset not the int 0, or S != T) takes 'xla' under
    'auto'.

    Args:
        q: [B, T, H, D]; k, v: [B, S, KV, D] with H % KV == 0.
        q_segment_ids: [B, T] int32; kv_segment_ids: [B, S] int32 (0 = padding key; module docstring).
        scale: multiplier of the scores. causal: mask keys after the query's slot.
        q_offset: key slot of query 0 (the cache index); a Python int allows the causal block path.
        impl: one of ATTENTION_IMPLS. packed: the rows may hold several documents (False: unpacked rows,
            queries in segment 1; only 'cudnn' uses it).
    Returns:
        [B, T, H, D] in q.dtype.
    Raises:
        ValueError from `resolve_attention_impl`, or when 'splash'/'cudnn' is asked for a cached call.
    """
    asked, impl = impl, resolve_attention_impl(impl)
    uncached = isinstance(q_offset, int) and q_offset == 0 and q.shape[1] == k.shape[1]
    if impl != "xla" and not uncached:
        if asked != "auto":
            raise ValueError(f"attention_impl {impl!r}: serves the uncached forward only (q_offset 0, "
                             f"S == T), got q_offset {q_offset!r}, T {q.shape[1]}, S {k.shape[1]}")
        impl = "xla"
    if uncached and context_size() > 1:
        return context_parallel_attention(q, k, v, q_segment_ids, kv_segment_ids, scale=scale, causal=causal,
                                          impl=impl)
    if impl == "splash":  # a Mosaic kernel: GSPMD cannot partition it, each device runs its own rows
        fn = functools.partial(splash_attention, scale=scale, causal=causal)
        return map_row_shards(fn, (q, k, v, q_segment_ids, kv_segment_ids))
    if impl == "cudnn":
        return cudnn_attention(q, k, v, q_segment_ids, kv_segment_ids, scale=scale, causal=causal,
                               packed=packed)
    if q.shape[1] > 1 and causal and isinstance(q_offset, int):
        return causal_gqa_attention(q, k, v, q_segment_ids, kv_segment_ids, scale, q_offset)
    return gqa_attention(q, k, v, segment_mask(q_segment_ids, kv_segment_ids, causal, q_offset), scale)


class GatedAttention(nn.Module):
    """Gated full-attention token mixer. Params: q_proj, k_proj, v_proj, o_proj, q_norm, k_norm.
    `attention_impl`: one of ATTENTION_IMPLS (`attention`)."""

    config: Qwen3_5MoeTextConfig
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    attention_impl: str = "xla"

    @nn.compact
    def __call__(self, x, cos, sin, q_segment_ids, kv_segment_ids, cache=None, index=None, packed=True):
        """
        Args:
            x: [B, T, hidden] compute dtype.
            cos, sin: [B, T, rotary_dim] from `rope_cos_sin`.
            q_segment_ids: [B, T] int32; kv_segment_ids: [B, S] int32, S = T without cache, S = cache length
                with one (`attention`; attention is causal within a segment).
            cache: None or {'k': [B, S, KV, D], 'v': [B, S, KV, D]}.
            index: int32 scalar, the cache slot of the first new token (with a cache); a static Python int
                lets a multi-token call skip the masked upper triangle (`causal_gqa_attention`).
            packed: static bool, the rows may hold several documents (`attention`).
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
        # a cache (the sampler's prefill and decode) takes 'xla' unless the implementation is 'xla' already
        impl = self.attention_impl if cache is None or self.attention_impl == "xla" else "auto"
        out = attention(q, k, v, q_segment_ids, kv_segment_ids, scale=d**-0.5, causal=True, q_offset=offset,
                        impl=impl, packed=packed)
        out = out.reshape(b, t, h * d)
        out = out * jax.nn.sigmoid(gate)
        return dense("o_proj", c.hidden_size, ("heads", "embed"))(out), new_cache
