"""A process's rows of each global batch: what one host of a multi-process run reads and batches.

With several processes (hosts) each one feeds only the rows its devices hold (`hat_jax.train.trainer.
process_rows` names them: sorted indices into the global batch of B rows). The global batch order stays
that of one process, so a run on P processes sees exactly the batches of a run on one:

- a random-access pipeline (`grain.MapDataset` of rows, e.g. the unpacked SFT rows): `HostRows` maps local
  element k to global element (k // n) * B + rows[k % n] (n = len(rows)), so process p reads, renders and
  tokenises only its rows; batching it by n gives global batch b's rows. The iterator's state (batches
  consumed) is the same number as one process's, so a run resumes on any process count.
- a sequential pipeline (packed rows: first-fit packing depends on every document before a row) keeps the
  global order by building the global batch and taking its rows (`TakeRows`): every process reads every
  document, but only its rows go to its devices.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import grain
import numpy as np


def check_rows(rows: Sequence[int], batch_size: int) -> np.ndarray:
    """`rows` as int64 [n]: raises ValueError unless they are strictly increasing indices in 0..batch_size-1 (n >= 1)."""
    r = np.asarray(rows, np.int64).reshape(-1)
    if r.size == 0 or r[0] < 0 or r[-1] >= batch_size or np.any(np.diff(r) <= 0):
        raise ValueError(f"host rows {r.tolist()}: expected increasing row indices in 0..{batch_size - 1}")
    return r


class HostRows(grain.MapDataset):
    """The elements of `parent` that are this process's rows of each global batch of `batch_size` (module
    docstring); len = (len(parent) // batch_size) * len(rows) (a last partial batch is dropped, as
    `batch(drop_remainder=True)` drops it)."""

    def __init__(self, parent: grain.MapDataset, batch_size: int, rows: Sequence[int]):
        super().__init__(parent)
        self._rows = check_rows(rows, batch_size)
        self._batch = batch_size
        self._length = (len(parent) // batch_size) * len(self._rows)

    def __len__(self) -> int:
        return self._length

    @property
    def rows(self) -> np.ndarray:
        """int64 [n]: the rows of each global batch this dataset holds."""
        return self._rows

    def _global_index(self, index: int) -> int:
        b, j = divmod(index, len(self._rows))
        return b * self._batch + int(self._rows[j])

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        return self._parent[self._global_index(index)]

    def __str__(self) -> str:
        return f"HostRows(batch_size={self._batch}, rows={self._rows.tolist()})"


class TakeRows(grain.transforms.Map):
    """Grain map: a global batch (every leaf [B, ...]) -> its rows `rows` (leaves [len(rows), ...])."""

    def __init__(self, rows: Sequence[int], batch_size: int):
        self.rows = check_rows(rows, batch_size)

    def map(self, element: Mapping[str, Any]) -> dict:
        return {k: np.asarray(v)[self.rows] for k, v in element.items()}
