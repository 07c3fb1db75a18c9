"""Masked grouped-query softmax attention: the implementations behind `hat_jax.model.attention.attention`.

Each computes softmax(scale * q k^T, masked) v with grouped KV heads (query head h uses KV head h // (H / KV)),
the softmax in float32, and returns q's dtype; all give the 'xla' reference's result.

Masking comes from segment ids and causality only (`segment_mask`, shaped like splash attention's
`SegmentIds` so that a fused kernel can take the same arguments): query t may attend key s when both are in
the same segment, the key is not padding (segment 0) and, causally, s <= q_offset + t. Packed rows give each
document its own id; an unpacked row puts every query in segment 1 and its keys in segment 1 (real) or 0
(padding), which is the plain causal + padding mask. Masked scores get the dtype's most negative finite
value, so a fully masked row gives a finite output (the mean of the values).

- 'xla', the exact reference, any backend: `gqa_attention` on `segment_mask`; `_single_query_attention`
  for a decode step; `causal_gqa_attention` when the query offset is static (no cache, or a cache with a
  static index), in query blocks that skip the masked upper triangle.
- 'splash': TPU Pallas splash attention (`jax.experimental.pallas.ops.tpu.splash_attention`,
  `splash_attention`), uncached forward only.
- 'cudnn': `jax.nn.dot_product_attention(implementation="cudnn")` on GPU (`cudnn_attention`), uncached,
  unpacked rows only.
- context parallel (`context_parallel_attention`): each device's queries against the all-gathered keys and
  values, with 'xla' or 'splash'.
"""

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from hat_jax.model.context_parallel import (CONTEXT_AXIS, check_sequence_split, context_size, gather_sequence,
                                            map_sequence_shards, sequence_spec, shard_start)


ATTENTION_BLOCK = 128  # query rows per block of `causal_gqa_attention`
MAX_ATTENTION_BLOCKS = 16  # longer sequences get larger blocks (the block loop is unrolled at trace time)
SPLASH_BLOCK = 512  # splash query/key block rows when T allows (MaxText's default sa_block_* on TPU)
SPLASH_MIN_BLOCK = 128  # splash blocks are multiples of the 128 TPU lanes


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




def _has_key(q_segment_ids: jax.Array, kv_segment_ids: jax.Array, causal: bool,
             q_offset: int | jax.Array = 0) -> jax.Array:
    """Whether each query has a key to attend, for queries at slots q_offset .. q_offset + T-1, in
    O(S log S) per row without the [T, S] mask: a stable sort of the kv ids puts each id's first slot
    first; query t (id g != 0) has a key iff id g occurs among the keys (causally: at a slot <= t).

    Args:
        q_segment_ids: [B, T] int; kv_segment_ids: [B, S] int (0 = padding).
    Returns:
        [B, T] bool.
    """
    def row(q_ids, kv_ids):
        order = jnp.argsort(kv_ids, stable=True)
        sorted_ids = kv_ids[order]
        idx = jnp.minimum(jnp.searchsorted(sorted_ids, q_ids, side="left"), kv_ids.shape[0] - 1)
        found = (sorted_ids[idx] == q_ids) & (q_ids != 0)
        if causal:
            found &= order[idx] <= q_offset + jnp.arange(q_ids.shape[0])
        return found

    return jax.vmap(row)(q_segment_ids, kv_segment_ids)


def _fully_masked_fix(out: jax.Array, v: jax.Array, q_segment_ids: jax.Array, kv_segment_ids: jax.Array,
                      causal: bool, q_offset: int | jax.Array = 0, mean_v: jax.Array | None = None) -> jax.Array:
    """Gives the rows of `out` [B, T, H, D] with no key to attend (`_has_key`) the reference's value (the
    mean of all S values, `causal_gqa_attention`; `mean_v` [B, KV, D] float32 when `v` holds only some of
    them)."""
    b, _, h, d = out.shape
    kv = v.shape[2]
    fully_masked = ~_has_key(q_segment_ids, kv_segment_ids, causal, q_offset)                             # [B, T]
    if mean_v is None:
        mean_v = jnp.mean(v.astype(jnp.float32), axis=1)                                       # [B, KV, D]
    mean_v = mean_v.astype(out.dtype)
    mean_v = jnp.repeat(mean_v, h // kv, axis=1)[:, None]                                       # [B, 1, H, D]
    return jnp.where(fully_masked[:, :, None, None], mean_v, out)


def splash_block(t: int) -> int:
    """Splash block rows for a length-T sequence: SPLASH_BLOCK when T >= SPLASH_BLOCK, else T rounded up to
    a multiple of SPLASH_MIN_BLOCK."""
    if t >= SPLASH_BLOCK:
        return SPLASH_BLOCK
    return -(-t // SPLASH_MIN_BLOCK) * SPLASH_MIN_BLOCK


def _splash_kernel(t: int, groups: int, causal: bool, block: int, interpret: bool, q_seq_shards: int = 1):
    """The splash MQA kernel for G = `groups` query heads over one KV head, length T (a multiple of block):
    q [G, T, D], k/v [T, D], SegmentIds([T], [T]) -> [G, T, D]. Built per trace (its mask info becomes
    constants of the trace; a cached kernel would leak them into the next trace). With `q_seq_shards` P the
    mask info is split into P query shards (the kernel then serves q [G, T / P, D] inside a shard_map, its
    spec `kernel.manual_sharding_spec`)."""
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    one = sa.CausalMask((t, t)) if causal else sa.FullMask((t, t))
    sizes = sa.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                          block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
                          block_q_dq=block, block_kv_dq=block)
    return sa.make_splash_mha(sa.MultiHeadMask([one] * groups), block_sizes=sizes, is_mqa=True, head_shards=1,
                              q_seq_shards=q_seq_shards, interpret=interpret)


def _splash_geometry(t: int, h: int, kv: int, block: int | None) -> tuple[int, int]:
    """(block rows, T padded to a multiple of them) of the splash kernel for T tokens (default block
    `splash_block(T)`).

    Raises:
        ValueError when H % KV != 0 or block is not a positive multiple of 128.
    """
    if h % kv:
        raise ValueError(f"attention_impl 'splash': heads {h} not a multiple of kv heads {kv}")
    block = block or splash_block(t)
    if block <= 0 or block % SPLASH_MIN_BLOCK:
        raise ValueError(f"splash_attention: block {block}: expected a positive multiple of {SPLASH_MIN_BLOCK}")
    return block, -(-t // block) * block


def _splash_operands(q, k, v, q_segment_ids, kv_segment_ids, scale: float, pad: int):
    """The splash kernel's operands: q scaled, heads-major q [B, KV, G, T', D] and k, v [B, KV, T', D], query
    ids [B, T'] and key ids [B, T'] with padding keys -1 (segment ids are >= 0, so no query attends them), each
    padded by `pad` tokens at the end (queries id 0, keys id -1): T' = T + pad."""
    qt, kt, vt = _to_heads_major((q * scale).astype(q.dtype), k, v)
    q_ids = q_segment_ids.astype(jnp.int32)
    kv_ids = jnp.where(kv_segment_ids == 0, -1, kv_segment_ids).astype(jnp.int32)
    if pad:
        qt = jnp.pad(qt, ((0, 0), (0, 0), (0, 0), (0, pad), (0, 0)))
        kt = jnp.pad(kt, ((0, 0), (0, 0), (0, pad), (0, 0)))
        vt = jnp.pad(vt, ((0, 0), (0, 0), (0, pad), (0, 0)))
        q_ids = jnp.pad(q_ids, ((0, 0), (0, pad)))
        kv_ids = jnp.pad(kv_ids, ((0, 0), (0, pad)), constant_values=-1)
    return qt, kt, vt, q_ids, kv_ids


def splash_attention(q: jax.Array, k: jax.Array, v: jax.Array, q_segment_ids: jax.Array,
                     kv_segment_ids: jax.Array, *, scale: float, causal: bool = True, block: int | None = None,
                     interpret: bool = False) -> jax.Array:
    """`attention` of an uncached forward (q_offset 0, S == T) with TPU splash attention (Pallas).

    The MQA form of the kernel (G = H / KV query heads over one KV head) is vmapped over batch and KV heads;
    the mask is splash's `CausalMask` (or `FullMask`) and-ed with its `SegmentIds` (q id == kv id), no
    [B, T, S] array. To give padding keys no query, kv ids 0 become -1 (segment ids are >= 0). T is padded
    to a multiple of `block` inside (queries with id 0, keys with id -1) and cut back. The scale multiplies
    q before the kernel; the kernel's softmax runs in float32. Rows with no key (padding queries) get the
    reference's value (`_fully_masked_fix`), so outputs and gradients match the 'xla' path.

    Args:
        q: [B, T, H, D]; k, v: [B, T, KV, D], H % KV == 0, same dtype.
        q_segment_ids, kv_segment_ids: [B, T] int32, >= 0 (0 = padding).
        scale: multiplier of the scores. causal: causal mask (else full within segments).
        block: block rows for all kernel passes, a multiple of 128 (default `splash_block(T)`).
        interpret: run the Pallas kernel in interpret mode (CPU tests).
    Returns:
        [B, T, H, D] in q.dtype.
    Raises:
        ValueError when S != T, H % KV != 0, or block is not a positive multiple of 128.
    """
    b, t, h, d = q.shape
    s, kv = k.shape[1], k.shape[2]
    if s != t:
        raise ValueError(f"attention_impl 'splash': expected keys of the queries' length (S == T), got T {t}, S {s}")
    block, tp = _splash_geometry(t, h, kv, block)
    pad = tp - t
    qt, kt, vt, q_ids, kv_ids = _splash_operands(q, k, v, q_segment_ids, kv_segment_ids, scale, pad)
    from jax.experimental.pallas.ops.tpu.splash_attention import SegmentIds

    kernel = _splash_kernel(tp, h // kv, causal, block, interpret)
    per_kv = jax.vmap(kernel, in_axes=(0, 0, 0, None))                                # over KV heads
    out = jax.vmap(per_kv, in_axes=(0, 0, 0, 0))(qt, kt, vt, SegmentIds(q_ids, kv_ids))  # over batch
    out = _from_heads_major(out[:, :, :, :t])
    return _fully_masked_fix(out, v, q_segment_ids, kv_segment_ids, causal)


def context_parallel_attention(q: jax.Array, k: jax.Array, v: jax.Array, q_segment_ids: jax.Array,
                               kv_segment_ids: jax.Array, *, scale: float, causal: bool = True, impl: str = "xla",
                               block: int | None = None, interpret: bool = False) -> jax.Array:
    """`attention` of an uncached forward with the sequence split over the mesh's 'context' axis
    (`hat_jax.model.context_parallel`): each device attends its T / P queries, at key slots
    [i T/P, (i+1) T/P), to the all-gathered T keys and values (the KV heads are few, so the gather is small).

    impl 'xla': `gqa_attention` on `segment_mask` with the shard's query offset ([B, KV, G, T/P, T] scores:
    the exact reference). impl 'splash': each shard pads its T/P tokens to a multiple of `block` (queries id 0,
    keys id -1, at the end of the shard: the padded index space keeps every real key's order, so the causal
    mask on it is the causal mask on the tokens) and runs the splash kernel whose mask info is split into P
    query shards (`_splash_kernel`); rows with no key get the reference's value (`_fully_masked_fix`).

    Args:
        q: [B, T, H, D]; k, v: [B, T, KV, D]; q_segment_ids, kv_segment_ids: [B, T] int32 (`attention`).
        scale, causal: as `attention`. impl: 'xla' or 'splash'. block, interpret: as `splash_attention`.
    Returns:
        [B, T, H, D] in q.dtype, equal to `attention` without the 'context' axis.
    Raises:
        ValueError: T not split evenly by the 'context' axis, or an impl other than 'xla' and 'splash'.
    """
    if impl not in ("xla", "splash"):
        raise ValueError(f"attention_impl {impl!r} with context parallelism: expected 'xla' or 'splash'")
    p = context_size()
    t_local = check_sequence_split(q.shape[1], "the attention's queries")
    spec = sequence_spec(q.shape)
    if impl == "xla":
        def body(q, k, v, q_ids, kv_ids):
            offset = shard_start(q.shape[1])
            k, v, kv_ids = gather_sequence(k), gather_sequence(v), gather_sequence(kv_ids)
            return gqa_attention(q, k, v, segment_mask(q_ids, kv_ids, causal, offset), scale)

        return map_sequence_shards(body, (q, k, v, q_segment_ids, kv_segment_ids))
    h, kv = q.shape[2], k.shape[2]
    block, tp = _splash_geometry(t_local, h, kv, block)
    kernel = _splash_kernel(p * tp, h // kv, causal, block, interpret, q_seq_shards=p)
    mesh = jax.sharding.get_abstract_mesh()
    kernel_spec = kernel.manual_sharding_spec(jax.sharding.NamedSharding(mesh, PartitionSpec(None, CONTEXT_AXIS)))

    def body(kernel, q, k, v, q_ids, kv_ids):
        pad = tp - q.shape[1]
        offset = shard_start(q.shape[1])
        kv_all = gather_sequence(kv_ids)
        mean_v = jax.lax.pmean(jnp.mean(v.astype(jnp.float32), axis=1), CONTEXT_AXIS)        # [B, KV, D]
        qt, kt, vt, ids_q, ids_kv = _splash_operands(q, k, v, q_ids, kv_ids, scale, pad)
        kt = jax.lax.all_gather(kt, CONTEXT_AXIS, axis=2, tiled=True)                 # [B, KV, P*tp, D]
        vt = jax.lax.all_gather(vt, CONTEXT_AXIS, axis=2, tiled=True)
        ids_kv = jax.lax.all_gather(ids_kv, CONTEXT_AXIS, axis=1, tiled=True)
        from jax.experimental.pallas.ops.tpu.splash_attention import SegmentIds

        per_kv = jax.vmap(kernel, in_axes=(0, 0, 0, None))
        out = jax.vmap(per_kv, in_axes=(0, 0, 0, 0))(qt, kt, vt, SegmentIds(ids_q, ids_kv))
        out = _from_heads_major(out[:, :, :, :q.shape[1]])
        return _fully_masked_fix(out, v, q_ids, kv_all, causal, offset, mean_v)

    return jax.shard_map(body, in_specs=(kernel_spec,) + (spec,) * 5, out_specs=spec, check_vma=False)(
        kernel, q, k, v, q_segment_ids, kv_segment_ids)


def cudnn_attention(q: jax.Array, k: jax.Array, v: jax.Array, q_segment_ids: jax.Array,
                    kv_segment_ids: jax.Array, *, scale: float, causal: bool = True, packed: bool = True,
                    implementation: str = "cudnn") -> jax.Array:
    """`attention` of an uncached forward with `jax.nn.dot_product_attention(implementation="cudnn")`.

    jax 0.10.2's `dot_product_attention` takes no segment ids: bias-free masking is causality plus
    `key_value_seq_lengths` (keys 0 .. L-1 real). So only unpacked, right-padded rows can be expressed:
    queries in segment 1, keys 1 (first L) then 0. L is the count of non-zero kv ids. Packed rows are
    refused (`packed`); a row that is not right-padded (e.g. left padding) gets NaN outputs rather than a
    silently wrong mask. Padding query rows get the reference's value (`_fully_masked_fix`).
    `implementation="xla"` runs the same argument mapping on CPU (tests).

    Args:
        q: [B, T, H, D]; k, v: [B, T, KV, D]. q_segment_ids, kv_segment_ids: [B, T] int32.
        scale: multiplier of the scores. causal: causal mask. packed: the rows may hold several documents.
        implementation: 'cudnn' (GPU) or 'xla'.
    Returns:
        [B, T, H, D] in q.dtype.
    Raises:
        ValueError for packed rows.
    """
    if packed:
        raise ValueError("attention_impl 'cudnn': packed rows (segment_ids) cannot be expressed with "
                         "jax.nn.dot_product_attention (no segment ids in jax 0.10.2); use 'xla' or 'splash'")
    t = q.shape[1]
    real = kv_segment_ids != 0
    lengths = jnp.sum(real, axis=1, dtype=jnp.int32)                                          # [B]
    right_padded = jnp.all(real == (jnp.arange(t)[None, :] < lengths[:, None]), axis=1)
    right_padded &= jnp.all(q_segment_ids == 1, axis=1)
    out = jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=causal, key_value_seq_lengths=lengths,
                                       implementation=implementation)
    out = jnp.where(right_padded[:, None, None, None], out, jnp.nan).astype(q.dtype)
    return _fully_masked_fix(out, v, q_segment_ids, kv_segment_ids, causal)
