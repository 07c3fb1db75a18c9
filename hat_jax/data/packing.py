"""Packing rendered documents into training rows of `seq_len` with segment ids: Grain's first-fit packer, wrapped.

Variant: `grain.experimental.FirstFitPackIterDataset` (grain 0.2.18; online first-fit bin packing): `bins` rows
are open at a time, each document goes into the first open row with room for it, and the first document that
fits in none closes the open rows, which are emitted in order (no bin shuffle), and opens new ones. The row
order is a function of the documents' order alone (deterministic). Documents longer than `seq_len` are cut to
their first `seq_len` tokens and counted (`fit_document`; with truncation off that is an error naming the
document).

A packed row (`pack_documents`): "input_ids" (pad id after the last document), "loss_mask", "segment_ids"
(0 = padding, 1..n = the row's documents in order, padding only at the end) and "positions" (the token's
0-based position within its document), int32 [seq_len]; "documents" (int32, documents in the row) and each
per-document count of `sum_features` summed over the row (int32, e.g. "truncated"). `loss_mask` is 0 at each
document's first token: the next-token target there would be predicted from the previous document's last
token (the losses also mask it from `segment_ids`: `hat_jax.train.losses.same_document_targets`).

Resume (`PackedBatches`): Grain's packer state is its parent's state at the first document of the open rows,
the next row to emit and a row counter; a restored iterator re-packs the open rows from their documents and
continues at exactly the next row. `PackedBatches` adds the running counts and a format tag
(`PACKED_FORMAT`) to that state; a data state without the tag (written by the unpacked pipelines, one
document per row) is refused with `DataStateFormatError`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import grain
import numpy as np

PACKED_FORMAT = "packed-v1"
ROW_KEYS: tuple[str, ...] = ("input_ids", "loss_mask", "segment_ids", "positions")


class DataStateFormatError(ValueError):
    """A checkpoint's data state was written by another data pipeline (e.g. the unpacked one)."""


def fit_document(input_ids: Sequence[int] | np.ndarray, loss_mask: Sequence[int] | np.ndarray, seq_len: int, *,
                 truncate: bool = True, name: str = "?") -> dict[str, np.ndarray]:
    """One rendered document cut to at most `seq_len` tokens, as the packer takes it.

    Args:
      input_ids, loss_mask: [n] token ids and 0/1 loss mask of the document (n >= 1).
      seq_len: the row length. truncate: cut a longer document (else raise). name: the document in messages.
    Returns:
      {"input_ids", "loss_mask": int32 [min(n, seq_len)], "truncated": int32 (1 when n > seq_len),
      "num_tokens": int32 (n, before truncation)}.
    Raises:
      ValueError: empty document, mismatched lengths, or n > seq_len with truncate=False (names the document).
    """
    ids, mask = np.asarray(input_ids, np.int32), np.asarray(loss_mask, np.int32)
    if ids.ndim != 1 or ids.shape != mask.shape or ids.size == 0:
        raise ValueError(f"document {name}: expected non-empty 1-D input_ids and loss_mask of one length, got "
                         f"shapes {ids.shape} and {mask.shape}")
    n = ids.size
    if n > seq_len and not truncate:
        raise ValueError(f"document {name}: {n} tokens > seq_len {seq_len} and truncation is off (turn truncation "
                         "on to cut it: --set data.truncate=true for SFT, truncate=true for pretraining; or raise "
                         "the row length)")
    return {"input_ids": ids[:seq_len], "loss_mask": mask[:seq_len], "truncated": np.int32(n > seq_len),
            "num_tokens": np.int32(n)}


class FinishPackedRow(grain.transforms.Map):
    """Grain map: a row of `FirstFitPackIterDataset` -> the packed row of the module docstring."""

    def __init__(self, sum_features: Sequence[str] = ()):
        self.sum_features = tuple(sum_features)

    def map(self, element: Mapping[str, Any]) -> dict[str, np.ndarray]:
        positions = np.asarray(element["input_ids_positions"], np.int32)
        segment_ids = np.asarray(element["input_ids_segment_ids"], np.int32)
        loss_mask = np.where(positions == 0, 0, element["loss_mask"]).astype(np.int32)  # no cross-document target
        out = {"input_ids": np.asarray(element["input_ids"], np.int32), "loss_mask": loss_mask,
               "segment_ids": segment_ids, "positions": positions,
               "documents": np.int32(segment_ids.max(initial=0))}
        for key in self.sum_features:
            out[key] = np.sum(np.stack([np.asarray(v) for v in element[key]]), axis=0).astype(np.int32)
        return out


def pack_documents(documents: grain.IterDataset, seq_len: int, *, bins: int, pad_id: int,
                   sum_features: Sequence[str] = ()) -> grain.IterDataset:
    """Documents -> packed rows (module docstring), first fit over `bins` open rows.

    Args:
      documents: an IterDataset of `fit_document`-like dicts: "input_ids", "loss_mask" int32 [n <= seq_len], and
        the per-document scalars/arrays named in `sum_features`; other keys are dropped.
      seq_len: row length. bins: rows open at a time (>= 1; more bins fill rows better and re-pack more
        documents on resume). pad_id: input id of padding.
      sum_features: per-document features summed per row (same shape in every document).
    Returns:
      an IterDataset of rows {"input_ids", "loss_mask", "segment_ids", "positions": int32 [seq_len],
      "documents": int32, each of sum_features: int32 of its per-document shape}.
    Raises:
      ValueError: seq_len or bins < 1. When iterated: a document longer than seq_len (Grain's message).
    """
    if seq_len < 1 or bins < 1:
        raise ValueError(f"pack_documents: seq_len ({seq_len}) and bins ({bins}) must be >= 1")
    packed = grain.experimental.FirstFitPackIterDataset(
        documents, length_struct={"input_ids": seq_len, "loss_mask": seq_len}, num_packing_bins=bins,
        shuffle_bins=False, meta_features=tuple(sum_features), padding_struct={"input_ids": pad_id, "loss_mask": 0})
    return packed.map(FinishPackedRow(sum_features))


def check_packed_batch(batch: Mapping[str, np.ndarray], where: str = "batch") -> None:
    """Raises ValueError naming the first bad row of a packed host batch: segment ids negative, decreasing or
    a document interrupted by padding, positions that do not restart at 0 on each document and count up by
    1 (`hat_jax.model.segments.check_segment_ids`); padding before a document (the packer keeps it at the
    end of a row); loss on a padding token or on a document's first token.

    Args:
      batch: {"segment_ids", "positions", "loss_mask": int [B, T], ...}. where: the batch in messages.
    """
    from hat_jax.model.segments import check_segment_ids

    segment_ids = np.asarray(batch["segment_ids"])
    try:
        check_segment_ids(segment_ids, np.asarray(batch["positions"]))
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None
    late = (segment_ids[:, 1:] > 0) & (segment_ids[:, :-1] == 0)
    if late.any():
        row, t = (int(i) for i in np.argwhere(late)[0])
        raise ValueError(f"{where}: segment_ids row {row}: a document starts at t = {t + 1} after padding; packed "
                         "rows keep padding at the end")
    loss = np.asarray(batch["loss_mask"]) != 0
    bad = loss & ((segment_ids == 0) | (np.asarray(batch["positions"]) == 0))
    if bad.any():
        row, t = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{where}: row {row} has loss_mask 1 at t = {t}, a padding token or a document's first "
                         "token (its target would cross documents)")


def refuse_packed_state(state: Any, name: str) -> None:
    """Raises DataStateFormatError when `state` (a checkpoint's data state, about to resume an unpacked pipeline
    named `name`) was written by a packed pipeline."""
    if isinstance(state, Mapping) and "format" in state:
        raise DataStateFormatError(f"{name} data state: the checkpoint's data state has format {state['format']!r}, "
                                   "this pipeline is unpacked; resume it with packing on (--set data.pack=true for "
                                   "SFT, pack=true for pretraining; the default) or start a new run directory")


class PackedBatches:
    """An iterator over packed batches with the running counts in its resumable state.

    Wraps a Grain iterator of packed batches (leaves [B, ...]), checks each batch (`check_packed_batch`) and
    counts what it yields. `get_state()` -> {"format": PACKED_FORMAT, "pipeline": the Grain iterator's state,
    "batches", "documents", "tokens" (non-pad tokens), "truncated_documents"} (JSON); `set_state` resumes at
    exactly the next batch.

    With `geometry` the state also records the packer's row length and open rows, which its pipeline state
    depends on (the open rows' contents and the documents drawn into them): `set_state` refuses a state written
    with other values, naming the config field, instead of resuming into a wrong or failing data order.

    Args:
      iterator: `iter(grain IterDataset)` of packed batches. name: the pipeline in messages ("pretraining", "SFT").
      geometry: {config field name: value} of the packer, e.g. {"data.seq_len": 2048, "data.pack_bins": 16}.
    """

    def __init__(self, iterator: Iterator[Mapping[str, np.ndarray]], name: str,
                 geometry: Mapping[str, int] | None = None):
        self.iterator, self.name = iterator, name
        self.geometry = dict(geometry or {})
        self.batches = self.documents = self.tokens = self.truncated = 0

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        batch = dict(next(self.iterator))
        check_packed_batch(batch, f"{self.name} batch {self.batches}")
        self.batches += 1
        self.documents += int(np.sum(batch["documents"]))
        self.tokens += int(np.count_nonzero(batch["segment_ids"]))
        self.truncated += int(np.sum(batch["truncated"])) if "truncated" in batch else 0
        return batch

    def get_state(self) -> dict:
        state = {"format": PACKED_FORMAT, "pipeline": self.iterator.get_state(), "batches": self.batches,
                 "documents": self.documents, "tokens": self.tokens, "truncated_documents": self.truncated}
        if self.geometry:
            state["geometry"] = dict(self.geometry)
        return state

    def set_state(self, state: Any) -> None:
        """Raises DataStateFormatError for a state of another format (e.g. the unpacked pipeline's), ValueError
        naming a missing or non-integer count."""
        if not isinstance(state, Mapping) or state.get("format") != PACKED_FORMAT:
            found = state.get("format") if isinstance(state, Mapping) else None
            keys = sorted(state) if isinstance(state, Mapping) else type(state).__name__
            raise DataStateFormatError(
                f"{self.name} data state: the checkpoint's data state has format {found!r} (keys {keys}), this "
                f"pipeline packs documents (format {PACKED_FORMAT!r}); a checkpoint written by the unpacked "
                "pipeline cannot continue its data order here: start a new run directory, or resume it with "
                "packing off (--set data.pack=false for SFT, pack=false for pretraining)")
        saved = state.get("geometry") or {}  # absent in states written before it was recorded: not checked
        changed = {k: (saved[k], v) for k, v in self.geometry.items() if k in saved and saved[k] != v}
        if changed:
            fields = ", ".join(f"{k} was {a}, now {b}" for k, (a, b) in changed.items())
            raise DataStateFormatError(
                f"{self.name} data state: the checkpoint's packer ran with other settings ({fields}); its open rows "
                "and document order cannot continue under the new ones: resume with the checkpoint's values, or "
                "start a new run directory")
        for key in ("batches", "documents", "tokens", "truncated_documents"):
            if not isinstance(state.get(key), int) or state[key] < 0:
                raise ValueError(f"{self.name} data state: {key!r} must be an int >= 0, got {state.get(key)!r}")
        self.iterator.set_state(state["pipeline"])
        self.batches, self.documents = state["batches"], state["documents"]
        self.tokens, self.truncated = state["tokens"], state["truncated_documents"]
