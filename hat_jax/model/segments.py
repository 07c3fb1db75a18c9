"""Segment ids of packed rows: several documents in one row of a batch.

`segment_ids: int32 [B, T]`: 0 = padding, 1..n = the documents of the row, in order. Each document is one
contiguous run of equal ids, and ids never decrease from one document to the next; padding (0) may stand
before, between or after documents (the model's maths is exact in all three places; the packer puts it at
the end of a row only). A row without packing is the one-segment case (ids 1 on its tokens).
The convention is fla's `cu_seqlens` varlen layout (flash-linear-attention `chunk_gated_delta_rule`) and
splash attention's `SegmentIds`, written per token. `uncached_inputs` turns either form of a call (segment ids,
or an attention mask) into the masks and positions the layers take.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def segment_starts(segment_ids: jax.Array) -> jax.Array:
    """True at each document's first token.

    Args:
        segment_ids: [B, T] int (0 = padding).
    Returns:
        [B, T] bool: segment_ids[t] > 0 and (t == 0 or segment_ids[t - 1] != segment_ids[t]).
    """
    prev = jnp.pad(segment_ids[:, :-1], ((0, 0), (1, 0)), constant_values=-1)
    return (segment_ids > 0) & (segment_ids != prev)


def segment_positions(segment_ids: jax.Array) -> jax.Array:
    """Per-document positions: 0 at each document's first token, counting up within the document.

    Args:
        segment_ids: [B, T] int (0 = padding).
    Returns:
        [B, T] int32; 0 on padding.
    """
    t = jnp.arange(segment_ids.shape[1], dtype=jnp.int32)
    last_start = jax.lax.cummax(jnp.where(segment_starts(segment_ids), t, 0), axis=1)
    return jnp.where(segment_ids > 0, t - last_start, 0).astype(jnp.int32)


def segment_ends(segment_ids: jax.Array) -> jax.Array:
    """True at each document's last token inside the row.

    Args:
        segment_ids: [B, T] int (0 = padding).
    Returns:
        [B, T] bool: segment_ids[t] > 0 and (t == T - 1 or segment_ids[t + 1] != segment_ids[t]).
    """
    nxt = jnp.pad(segment_ids[:, 1:], ((0, 0), (0, 1)), constant_values=-1)
    return (segment_ids > 0) & (segment_ids != nxt)


def check_segment_ids(segment_ids, positions=None) -> None:
    """Host-side validation of packed-row metadata (numpy; call it on batches before they reach the model).

    Args:
        segment_ids: [B, T] integer array-like (module docstring for the layout).
        positions: optional [B, T] integer array-like; on real tokens it must equal
            `segment_positions(segment_ids)` (0 at each document's first token, +1 per token). Padding
            positions are not checked.
    Raises:
        ValueError naming the field, the row and the offending token when: segment_ids is not 2-D or not
        integer; an id is negative; ids decrease between real tokens of a row; a document's id reappears
        after padding (a document must be contiguous); positions is not integer, has another shape or
        disagrees with the per-document positions.
    """
    seg = np.asarray(segment_ids)
    if seg.ndim != 2 or not np.issubdtype(seg.dtype, np.integer):
        raise ValueError(f"segment_ids: expected a 2-D integer array [B, T], got shape {seg.shape} "
                         f"dtype {seg.dtype}")
    for row in range(seg.shape[0]):
        ids = seg[row]
        if np.any(ids < 0):
            t = int(np.argmax(ids < 0))
            raise ValueError(f"segment_ids row {row}: token {t} has id {ids[t]}; expected 0 (padding) or a "
                             f"document id >= 1")
        real = np.flatnonzero(ids > 0)
        drops = np.flatnonzero(np.diff(ids[real]) < 0)
        if drops.size:
            a, b = real[drops[0]], real[drops[0] + 1]
            raise ValueError(f"segment_ids row {row}: ids must be non-decreasing over real tokens, got "
                             f"{ids[a]} at token {a} then {ids[b]} at token {b}")
        gaps = np.flatnonzero((ids[real][1:] == ids[real][:-1]) & (np.diff(real) > 1))
        if gaps.size:
            a, b = real[gaps[0]], real[gaps[0] + 1]
            raise ValueError(f"segment_ids row {row}: document {ids[a]} is interrupted by padding between "
                             f"tokens {a} and {b}; expected each document to be one contiguous run")
    if positions is None:
        return
    pos = np.asarray(positions)
    if pos.shape != seg.shape or not np.issubdtype(pos.dtype, np.integer):
        raise ValueError(f"positions: expected an integer array of shape {seg.shape} (that of segment_ids), got "
                         f"shape {pos.shape} dtype {pos.dtype}")
    t = np.arange(seg.shape[1])
    prev = np.pad(seg[:, :-1], ((0, 0), (1, 0)), constant_values=-1)
    last_start = np.maximum.accumulate(np.where((seg > 0) & (seg != prev), t, 0), axis=1)
    expected = np.where(seg > 0, t - last_start, 0)                     # `segment_positions` in numpy
    bad = (seg > 0) & (pos != expected)
    if np.any(bad):
        row, t = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"positions row {row}: token {t} (document {seg[row, t]}) has position {pos[row, t]}; "
                         f"expected {expected[row, t]}, the per-document position (0 at a document's first "
                         f"token)")


def uncached_inputs(ids: jax.Array, attention_mask, segment_ids, positions):
    """Masks and positions of a call without a cache.

    Args:
        ids: [B, T] int32. attention_mask: [B, T] or None. segment_ids: [B, T] int or None.
        positions: [B, T] int32 or None (then `default_positions`, or `segment_positions` of packed rows).
    Returns:
        (token_mask [B, T] bool, q_segment_ids [B, T] int32, kv_segment_ids [B, T] int32,
         segment_ids [B, T] int32 or None, positions [B, T] int32).
    Raises:
        ValueError when both masks are given, or segment_ids is not an integer array shaped like ids.
    """
    if segment_ids is None:
        token_mask = token_mask_of(ids, attention_mask)
        # an unpacked row: every query in segment 1, keys in 1 (real) or 0 (padding): the causal + key-padding
        # mask (a padding query attends the real keys before it, as in transformers)
        q_seg, kv_seg = jnp.ones(ids.shape, jnp.int32), token_mask.astype(jnp.int32)
        return token_mask, q_seg, kv_seg, None, default_positions(token_mask) if positions is None else positions
    if attention_mask is not None:
        raise ValueError("segment_ids and attention_mask are exclusive: with segment_ids the token mask is "
                         "segment_ids > 0; expected attention_mask=None")
    if segment_ids.shape != ids.shape or not jnp.issubdtype(segment_ids.dtype, jnp.integer):
        raise ValueError(f"segment_ids: expected an integer array of shape {ids.shape} (that of input_ids), "
                         f"got {segment_ids.dtype} {segment_ids.shape}")
    seg = segment_ids.astype(jnp.int32)
    return seg > 0, seg, seg, seg, segment_positions(seg) if positions is None else positions


def token_mask_of(ids: jax.Array, attention_mask: jax.Array | None) -> jax.Array:
    """[B, T] bool, True on real tokens (all True without an attention mask)."""
    return jnp.ones(ids.shape, bool) if attention_mask is None else attention_mask.astype(bool)


def default_positions(token_mask: jax.Array) -> jax.Array:
    """[B, T] int32: the number of real tokens before each token (arange(T) without padding)."""
    return jnp.maximum(jnp.cumsum(token_mask, axis=1) - 1, 0)
