"""Segment ids of packed rows: several documents in one row of a batch.

`segment_ids: int32 [B, T]`: 0 = padding, 1..n = the documents of the row, in order. Each document is one
contiguous run of equal ids, and ids never decrease from one document to the next; padding (0) may stand
before, between or after documents (the model's maths is exact in all three places; the packer puts it at
the end of a row only). A row without packing is the one-segment case (ids 1 on its tokens).
The convention is fla's `cu_seqlens` varlen layout (flash-linear-attention `chunk_gated_delta_rule`) and
splash attention's `SegmentIds`, written per token.
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
        after padding (a document must be contiguous); positions has another
        shape or disagrees with the per-document positions.
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
    if pos.shape != seg.shape:
        raise ValueError(f"positions: expected shape {seg.shape} (that of segment_ids), got {pos.shape}")
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
