"""Packing a policy update's sampled sequences (RL, OPD) into fewer rows of the same width, with segment ids.

Variant: first-fit decreasing (each sequence, longest first, goes into the first row with room; Johnson 1973:
at most 11/9 of the optimal row count + 1), done separately for each PPO minibatch's sequences so that a
minibatch keeps exactly its sequences, and the rows of every minibatch padded with empty rows to one count, a
multiple of the micro-batches per minibatch. Ties keep the batch order (a stable sort): the packing is a
function of the sequence lengths alone.

Aggregation: a packed row holds several sequences, so the per-sequence normalisers of
`hat_jax.train.losses.aggregate` become per-token weights computed here (`loss_weights`), and its denominator a
count (`loss_counts`, summed by the loss function): with L the per-token loss, m the action mask, n_i the action
tokens of sequence i, S the counted sequences (rows of the unpacked batch with an action token) and L_max the
constant generation budget,
  - "token-mean":              weight m,           count m (per token)
  - "seq-mean-token-mean":     weight m / n_i,     count 1 at each counted sequence's first action token
  - "seq-mean-token-sum-norm": weight m / L_max,   count as above
so sum(weight x L) / sum(count) over all micro-batches equals the unpacked batch's aggregate exactly (up to
float summation order).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from hat_jax.rollout.episodes import pack_expert_ids
from hat_jax.train.losses import check_aggregation

ROW_KEYS = ("attention_mask", "advantages", "expert_ids")   # the keys packed other than token by token


def first_fit_decreasing(lengths, capacity: int) -> list[list[int]]:
    """Rows of sequence indices: first fit in order of decreasing length (stable for equal lengths).

    Args:
        lengths: [n] ints, each 1..capacity. capacity: tokens per row.
    Returns:
        the rows, each a list of indices into `lengths` in the order they were placed.
    Raises:
        ValueError: a length outside 1..capacity (naming the sequence).
    """
    lengths = [int(x) for x in lengths]
    for i, n in enumerate(lengths):
        if not 1 <= n <= capacity:
            raise ValueError(f"sequence {i}: {n} tokens; expected 1..{capacity} (the row width)")
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda j: -lengths[j]):
        for r, free in enumerate(room):
            if lengths[i] <= free:
                rows[r].append(i)
                room[r] -= lengths[i]
                break
        else:
            rows.append([i])
            room.append(capacity - lengths[i])
    return rows


def _token_spans(attention_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """([N] first token, [N] token count) of rows whose tokens are one run (left or right padding); ValueError
    naming the first row that is empty or has a gap."""
    att = np.asarray(attention_mask) != 0
    lengths = att.sum(axis=1)
    starts = np.argmax(att, axis=1)
    cols = np.arange(att.shape[1])[None, :]
    run = (cols >= starts[:, None]) & (cols < (starts + lengths)[:, None])
    bad = np.nonzero((att != run).any(axis=1) | (lengths == 0))[0]
    if bad.size:
        raise ValueError(f"row {int(bad[0])} of the policy batch: its tokens must be one non-empty run (padding "
                         "before or after it only) to be packed")
    return starts, lengths


def pack_policy_batch(batch: Mapping[str, np.ndarray], *, aggregation: str, max_len: int | None = None,
                      minibatches: int = 1, rows_multiple: int = 1,
                      top_k: int | None = None) -> dict[str, np.ndarray] | None:
    """The packed update batch of an unpacked RL batch (module docstring), or None when packing saves no row.

    Args:
        batch: host arrays: attention_mask, action_mask [N, T] int32 (each row's tokens one run, padding
            before or after it), every other [N, T, ...] array per token (input_ids, old_logprobs,
            ref_logprobs, OPD's teacher_logprobs and teacher_hidden [N, T, H]); optional advantages [N] float32
            (RL: one per sequence) and expert_ids [N, L, W, T] int32 (packed routing ids, tokens last).
        aggregation: one of `hat_jax.train.losses.AGGREGATIONS`. max_len: L_max ("seq-mean-token-sum-norm").
        minibatches: PPO minibatches (contiguous row blocks of the unpacked batch, N divisible by it).
        rows_multiple: the packed row count of a minibatch is a multiple of it (the micro-batches per minibatch).
        top_k: experts per token (required with expert_ids: the padding's ids are 0..top_k-1).
    Returns:
        None when the packed rows would be as many as N; else segment_ids [R, T] int32 (0 = padding, 1..n the
        row's sequences) in place of attention_mask, every per-token array [R, T, ...] (0 on padding),
        advantages [R, T] (each sequence's advantage on its tokens) when given, loss_weights and loss_counts
        [R, T] float32, and expert_ids when given (padding: expert ids 0..k-1 as the rollouts fill unrecorded
        positions); R = minibatches x rows per minibatch.
    Raises:
        ValueError: an unknown aggregation, sum-norm without a max_len >= 1, minibatches or rows_multiple < 1, N
            not divisible by minibatches, a missing or mis-shaped array (naming it), a row whose tokens are not
            one run or with action tokens on padding (naming it), expert_ids without top_k.
    """
    check_aggregation(aggregation)
    if aggregation == "seq-mean-token-sum-norm" and (isinstance(max_len, bool) or not isinstance(max_len, int)
                                                     or max_len < 1):
        raise ValueError(f"aggregation 'seq-mean-token-sum-norm' needs max_len, the constant generation budget (an "
                         f"integer >= 1), got {max_len!r}")
    missing = [k for k in ("input_ids", "attention_mask", "action_mask") if k not in batch]
    if missing:
        raise ValueError(f"pack_policy_batch: the batch has no {', '.join(missing)}")
    if np.ndim(batch["input_ids"]) != 2:
        raise ValueError(f"batch['input_ids'] has shape {np.shape(batch['input_ids'])}; expected [N, T]")
    n_rows, width = np.shape(batch["input_ids"])
    for name, value in (("minibatches", minibatches), ("rows_multiple", rows_multiple)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"pack_policy_batch: {name} = {value!r}; expected an integer >= 1")
    if n_rows % minibatches:
        raise ValueError(f"{n_rows} policy rows are not divisible into minibatches={minibatches}")
    if np.shape(batch["attention_mask"]) != (n_rows, width):
        raise ValueError(f"batch['attention_mask'] has shape {np.shape(batch['attention_mask'])}; expected "
                         f"[{n_rows}, {width}]")
    if "advantages" in batch and np.shape(batch["advantages"]) != (n_rows,):
        raise ValueError(f"batch['advantages'] has shape {np.shape(batch['advantages'])}; expected [{n_rows}] "
                         "(one per sequence)")
    starts, lengths = _token_spans(batch["attention_mask"])
    raw_act = np.asarray(batch["action_mask"])
    not_binary = ~np.isin(raw_act, (0, 1))
    if raw_act.shape == (n_rows, width) and not_binary.any():
        row = int(np.nonzero(not_binary.any(axis=1))[0][0])
        raise ValueError(f"batch['action_mask'] row {row} holds values other than 0 and 1; expected a 0/1 mask "
                         "(per-token weights are not part of the packed layout)")
    act = raw_act.astype(np.int32)
    per_token = {k: np.asarray(v) for k, v in batch.items() if k not in ROW_KEYS}
    for key, value in per_token.items():
        if value.shape[:2] != (n_rows, width):
            raise ValueError(f"batch[{key!r}] has shape {value.shape}; expected [{n_rows}, {width}, ...] (per token)")
    outside = np.nonzero(((act != 0) & (np.asarray(batch["attention_mask"]) == 0)).any(axis=1))[0]
    if outside.size:
        raise ValueError(f"row {int(outside[0])} of the policy batch has action tokens on padding "
                         "(action_mask 1 where attention_mask is 0)")
    eids = batch.get("expert_ids")
    if eids is not None:
        if not top_k:
            raise ValueError("pack_policy_batch: expert_ids need top_k (the padding positions get ids 0..top_k-1)")
        eids = np.asarray(eids)
        fill = pack_expert_ids(np.arange(top_k, dtype=np.int32)[None, :])             # [W, 1]
        if eids.ndim != 4 or eids.shape[0] != n_rows or eids.shape[2:] != (fill.shape[0], width):
            raise ValueError(f"batch['expert_ids'] has shape {eids.shape}; expected [{n_rows}, L, {fill.shape[0]}, "
                             f"{width}] (packed routing ids of top_k = {top_k}, tokens last)")
    per_block = n_rows // minibatches
    blocks = [[[b * per_block + i for i in row]
               for row in first_fit_decreasing(lengths[b * per_block:(b + 1) * per_block], width)]
              for b in range(minibatches)]
    rows_per_block = -(-max(len(rows) for rows in blocks) // rows_multiple) * rows_multiple
    if rows_per_block >= per_block:
        return None
    r_total = rows_per_block * minibatches
    n_act = act.sum(axis=1)
    out = {k: np.zeros((r_total,) + v.shape[1:], v.dtype) for k, v in per_token.items()}
    out.update({key: np.zeros((r_total, width), np.float32) for key in ("loss_weights", "loss_counts")})
    out["segment_ids"] = np.zeros((r_total, width), np.int32)
    adv = batch.get("advantages")
    if adv is not None:
        out["advantages"] = np.zeros((r_total, width), np.float32)
    if eids is not None:
        out["expert_ids"] = np.array(np.broadcast_to(fill, (r_total, eids.shape[1]) + fill.shape[:1] + (width,)))
    for b, rows in enumerate(blocks):
        for r, seqs in enumerate(rows):
            row, t0 = b * rows_per_block + r, 0
            for s, i in enumerate(seqs, start=1):
                n, span = int(lengths[i]), slice(t0, t0 + int(lengths[i]))
                src = slice(int(starts[i]), int(starts[i]) + n)
                for key, value in per_token.items():
                    out[key][row, span] = value[i, src]
                out["segment_ids"][row, span] = s
                m = act[i, src].astype(np.float32)
                if adv is not None:
                    out["advantages"][row, span] = float(adv[i]) * (m != 0)
                if aggregation == "token-mean":
                    out["loss_weights"][row, span], out["loss_counts"][row, span] = m, m
                elif n_act[i]:  # a sequence without sampled tokens weighs and counts nothing
                    scale = 1.0 / n_act[i] if aggregation == "seq-mean-token-mean" else 1.0 / max_len
                    out["loss_weights"][row, span] = m * np.float32(scale)
                    out["loss_counts"][row, t0 + int(np.argmax(m))] = 1.0
                if eids is not None:
                    out["expert_ids"][row, ..., span] = eids[i, ..., src]
                t0 += n
    return out


def packed_update(batch: Mapping[str, np.ndarray], *, pack: bool, aggregation: str, max_len: int | None = None,
                  minibatches: int = 1, rows_multiple: int = 1,
                  top_k: int | None = None) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """A stage's update batch: `pack_policy_batch` when `pack` and it saves rows, else `batch` as it is; with the
    metrics data/update_rows (rows of the update) and data/slot_fill (real tokens / slots).

    Args and errors: as `pack_policy_batch` (the arrays only; `batch` holds nothing else).
    """
    real = float(np.sum(batch["attention_mask"]))
    packed = None
    if pack:
        packed = pack_policy_batch(batch, aggregation=aggregation, max_len=max_len, minibatches=minibatches,
                                   rows_multiple=rows_multiple, top_k=top_k)
    out = dict(batch) if packed is None else packed
    return out, {"data/update_rows": float(len(out["input_ids"])),
                 "data/slot_fill": real / float(np.size(out["input_ids"]))}
