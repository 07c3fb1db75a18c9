"""The SFT data pipeline: trajectory records -> HSA (Grain `random_map`) -> tokens + loss mask -> batches.

Variant implemented and why (HSA-SFT, stage 1 of the HAT report, arXiv 2608.15763 (TaoLive, 2026),
"Training, three stages"):
- `grain.MapDataset.source(records).shuffle(seed).random_map(HSAStep, seed)`: Grain derives each
  element's random generator from the pipeline seed and the element's index, so HSA is seeded per
  record and a resumed run sees the same augmented stream. With probability `p_hsa` a record is
  augmented (`hsa.compose` on its harness, the trajectory rewritten with the name map), otherwise it
  keeps the original harness: the paper mixes original and augmented harnesses, and a tiny-scale
  recall probe run while designing hat-jax showed that a model trained only on augmented harnesses
  scores 0% on the original one's names.
- Hook-parameter changes that change behaviour (`hsa.behaviour_changed` on the trajectory) need the
  oracle: with a `reroll` callable the trajectory is re-rolled under the new harness; without one the
  draw is recomposed without "hook_params" (same seed), so no record claims a behaviour it lacks.
- Tokenisation: `hat_jax.harness.render.render_tokens(tokenizer, harness, messages)` (the system
  prompt is re-rendered from the record's harness), then truncation/padding to `seq_len` (padding,
  not packing: one trajectory per row, pad id = tokenizer.pad_token_id, loss_mask 0 on padding).
  Truncation keeps the first `seq_len` tokens and is never silent: each row carries `truncated`
  (1 when the trajectory was longer than `seq_len`) and `num_tokens` (its length before
  truncation), and each `TokenizeAndPad` logs one warning, the first time it truncates a row, and one
  more the first time a row keeps no loss token at all (all its assistant tokens were cut off), with
  the row's figures and the running counts; the per-row fields give the exact counts.
- Batches: `batch(batch_size, drop_remainder=True)` then `to_iter_dataset()`; the iterator's
  `get_state()` is a small JSON-serialisable dict (checkpoints store it) and `set_state` resumes at
  exactly the next batch.
Each element records which transforms were applied (`hsa_applied`, int8 over `hsa.TRANSFORMS`), so
`transform_shares` reports the share of each transform in a sampled epoch.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import grain
import numpy as np

from hat_jax.harness import hsa
from hat_jax.harness.state import HarnessState

log = logging.getLogger(__name__)

Record = Mapping[str, Any]  # {"messages": [...], "task_id": str, "harness_id": str, "seed": int, ...}
Reroll = Callable[[Record, HarnessState, int], Sequence[Mapping[str, Any]]]
RECORD_KEYS: tuple[str, ...] = ("messages", "task_id", "harness_id", "seed")


@dataclasses.dataclass(frozen=True)
class SFTDataConfig:
    """The SFT pipeline's settings.

    Attributes:
      seq_len: tokens per row (longer trajectories are truncated, shorter ones padded).
      batch_size: rows per batch (the last partial batch of the run is dropped).
      seed: shuffle and HSA seed.
      p_hsa: probability that a record is augmented (else it keeps its original harness).
      hsa: the HSA transforms' configuration.
      split: "train" or "heldout" (held-out families, for building Harness-Variant QA data).
      num_epochs: passes over the records (each reshuffled and re-augmented); None = forever.
      shuffle: shuffle the records (per epoch).
      read_threads, prefetch: `grain.ReadOptions` of the iterator.
    """

    seq_len: int = 2048
    batch_size: int = 8
    seed: int = 0
    p_hsa: float = 0.5
    hsa: hsa.HSAConfig = hsa.HSAConfig()
    split: str = "train"
    num_epochs: int | None = 1
    shuffle: bool = True
    read_threads: int = 1
    prefetch: int = 8

    def __post_init__(self):
        if self.seq_len < 1 or self.batch_size < 1:
            raise ValueError(f"SFTDataConfig: seq_len ({self.seq_len}) and batch_size ({self.batch_size}) must be >= 1")
        if not 0.0 <= self.p_hsa <= 1.0:
            raise ValueError(f"SFTDataConfig.p_hsa = {self.p_hsa}: expected a probability in [0, 1]")
        if self.split not in ("train", "heldout"):
            raise ValueError(f"SFTDataConfig.split = {self.split!r}: expected 'train' or 'heldout'")
        if self.num_epochs is not None and self.num_epochs < 1:
            raise ValueError(f"SFTDataConfig.num_epochs = {self.num_epochs}: expected >= 1 or None")


class HSAStep(grain.transforms.RandomMap):
    """Grain random map: record -> record with "harness", rewritten "messages" and "hsa_applied"."""

    def __init__(self, harnesses: Mapping[str, HarnessState], config: SFTDataConfig, reroll: Reroll | None = None):
        self.harnesses = dict(harnesses)
        self.config = config
        self.reroll = reroll

    def random_map(self, element: Record, rng: np.random.Generator) -> dict:
        missing = [k for k in RECORD_KEYS if k not in element]
        if missing:
            raise KeyError(f"SFT record {element.get('task_id', '?')!r} lacks {missing} (expected keys {RECORD_KEYS})")
        if element["harness_id"] not in self.harnesses:
            raise KeyError(f"SFT record {element['task_id']!r}: unknown harness_id {element['harness_id']!r}")
        old = self.harnesses[element["harness_id"]]
        seed = int(rng.integers(2**62)) ^ int(element["seed"])
        messages = [dict(m) for m in element["messages"]]
        new, applied = old, ()
        if random.Random(seed).random() < self.config.p_hsa:
            new, name_map, applied = hsa.compose(old, random.Random(seed + 1), self.config.hsa, self.config.split)
            if "hook_params" in applied and hsa.behaviour_changed(old, new, messages):
                if self.reroll is not None:
                    messages = [dict(m) for m in self.reroll(element, new, seed)]
                    name_map = None
                else:
                    new, name_map, applied = hsa.compose(
                        old, random.Random(seed + 1), self.config.hsa, self.config.split, exclude=("hook_params",)
                    )
            if name_map is not None and applied:
                messages = hsa.rewrite_messages(messages, old, new, name_map)
        flags = np.asarray([t in applied for t in hsa.TRANSFORMS], dtype=np.int8)
        return {**element, "messages": messages, "harness": new, "hsa_applied": flags}


class TokenizeAndPad(grain.transforms.Map):
    """Grain map: HSA'd record -> {"input_ids", "loss_mask", "attention_mask": int32 [seq_len],
    "num_tokens": int32 (before truncation), "truncated": int8 (1 when num_tokens > seq_len),
    "hsa_applied": int8 [len(TRANSFORMS)]}.

    Logs one warning the first time a row is truncated and one the first time a row is left with no
    loss token (see the module docstring); `counts` holds the running totals ("rows", "truncated",
    "no_loss_tokens") of this instance.
    """

    def __init__(self, tokenizer: Any, seq_len: int, render_tokens: Callable | None = None):
        self.tokenizer = tokenizer
        self.seq_len = seq_len
        self.render_tokens = render_tokens
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_id = 0 if pad is None else int(pad)
        self.counts = {"rows": 0, "truncated": 0, "no_loss_tokens": 0}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _count(self, element: Mapping[str, Any], n_tokens: int, loss_total: int, loss_kept: int) -> None:
        truncated, empty = n_tokens > self.seq_len, loss_kept == 0
        with self._lock:
            c = self.counts
            c["rows"] += 1
            c["truncated"] += truncated
            c["no_loss_tokens"] += empty
            first_truncated, first_empty = truncated and c["truncated"] == 1, empty and c["no_loss_tokens"] == 1
            counts = dict(c)
        who = element.get("task_id", "?")
        if first_truncated:
            log.warning(
                "SFT row %s truncated: %d tokens > seq_len %d, %d of its %d loss tokens kept "
                "(%d of %d rows truncated so far; rows carry `truncated` and `num_tokens`; this is logged once)",
                who, n_tokens, self.seq_len, loss_kept, loss_total, counts["truncated"], counts["rows"],
            )
        if first_empty:
            log.warning(
                "SFT row %s has no loss token left (%d tokens, seq_len %d, %d loss tokens before truncation): "
                "it trains nothing (%d of %d rows so far; this is logged once)",
                who, n_tokens, self.seq_len, loss_total, counts["no_loss_tokens"], counts["rows"],
            )

    def map(self, element: Mapping[str, Any]) -> dict:
        render = self.render_tokens
        if render is None:
            from hat_jax.harness.render import render_tokens as render
        ids, mask = render(self.tokenizer, element["harness"], element["messages"])
        ids, mask = np.asarray(ids, np.int32), np.asarray(mask, np.int32)
        n = min(len(ids), self.seq_len)
        out = {
            "input_ids": np.full(self.seq_len, self.pad_id, np.int32),
            "loss_mask": np.zeros(self.seq_len, np.int32),
            "attention_mask": np.zeros(self.seq_len, np.int32),
        }
        out["input_ids"][:n], out["loss_mask"][:n], out["attention_mask"][:n] = ids[:n], mask[:n], 1
        out["num_tokens"] = np.int32(len(ids))
        out["truncated"] = np.int8(len(ids) > self.seq_len)
        out["hsa_applied"] = element["hsa_applied"]
        self._count(element, len(ids), int(mask.sum()), int(mask[:n].sum()))
        return out


def oracle_reroll(world: Any, tasks: Mapping[str, Any], policy: Any, env_config: Any = None) -> Reroll:
    """A `Reroll` that re-runs a record's task under the new harness with `policy` (e.g. the oracle).

    Args:
      world: the `hat_jax.sim.catalog.World` the tasks come from.
      tasks: task_id -> `Task` for the records' task ids.
      policy: a `hat_jax.sim.policy.Policy` (the noise-free `OracleTeacher` for SFT data).
      env_config: `hat_jax.sim.env.EnvConfig` the records were rolled out with (None = default).
    Returns:
      (record, harness, seed) -> the new episode's messages; the env is seeded with record["seed"],
      so injected faults are those of the original rollout. A fresh env per call (thread-safe).
    Raises (when called):
      KeyError: a record's task_id is not in `tasks`.
    """
    from hat_jax.sim.env import LiveStreamEnv
    from hat_jax.sim.rollout import rollout

    def reroll(record: Record, harness: HarnessState, seed: int) -> list[dict]:
        if record["task_id"] not in tasks:
            raise KeyError(f"oracle_reroll: no task {record['task_id']!r}")
        env = LiveStreamEnv(world, env_config)
        episode = rollout(env, policy, tasks[record["task_id"]], harness, seed=int(record["seed"]))
        return [dict(m) for m in episode.messages]

    return reroll


def hsa_dataset(
    records: Sequence[Record],
    harnesses: Mapping[str, HarnessState],
    config: SFTDataConfig = SFTDataConfig(),
    reroll: Reroll | None = None,
) -> grain.MapDataset:
    """The pipeline up to HSA: source -> shuffle -> `HSAStep` (-> repeat for num_epochs != 1).

    Args:
      records: trajectory records (keys `RECORD_KEYS`; messages in OpenAI format under the record's
        harness).
      harnesses: harness_id -> HarnessState.
      config: pipeline settings. reroll: (record, new harness, seed) -> messages, the oracle
        re-rolling a trajectory whose behaviour a hook change altered; None recomposes without
        "hook_params" instead.
    Returns:
      a `grain.MapDataset` of dicts (the record plus "harness" and "hsa_applied").
    Raises:
      ValueError: no records.
    """
    if not records:
        raise ValueError("hsa_dataset: no records")
    ds = grain.MapDataset.source(list(records))
    if config.shuffle:
        ds = ds.shuffle(seed=config.seed)
    ds = ds.random_map(HSAStep(harnesses, config, reroll), seed=config.seed)
    if config.num_epochs != 1:
        ds = ds.repeat(config.num_epochs)
    return ds


def sft_dataset(
    records: Sequence[Record],
    harnesses: Mapping[str, HarnessState],
    tokenizer: Any,
    config: SFTDataConfig = SFTDataConfig(),
    *,
    reroll: Reroll | None = None,
    render_tokens: Callable | None = None,
) -> grain.IterDataset:
    """The SFT pipeline: `hsa_dataset` -> `TokenizeAndPad` -> batch(drop_remainder) -> IterDataset.

    Args:
      records, harnesses, config, reroll: as in `hsa_dataset`.
      tokenizer: a fast Hugging Face tokenizer with the Qwen-format chat template.
      render_tokens: (tokenizer, harness, messages) -> (ids, loss_mask); default
        `hat_jax.harness.render.render_tokens`.
    Returns:
      a `grain.IterDataset` of batches {"input_ids", "loss_mask", "attention_mask": int32 [B, seq_len],
      "num_tokens": int32 [B] (lengths before truncation), "truncated": int8 [B] (1 for a row cut to
      seq_len), "hsa_applied": int8 [B, len(hsa.TRANSFORMS)]}. `iter(ds)` gives an iterator with
      `get_state()` (JSON-serialisable) / `set_state(state)`. Truncation is logged (module docstring).
    Raises:
      ValueError: no records, or fewer records than one batch.
    """
    ds = hsa_dataset(records, harnesses, config, reroll)
    if config.num_epochs is not None and len(records) * config.num_epochs < config.batch_size:
        raise ValueError(
            f"sft_dataset: {len(records)} records x {config.num_epochs} epochs < one batch of {config.batch_size}"
        )
    ds = ds.map(TokenizeAndPad(tokenizer, config.seq_len, render_tokens))
    ds = ds.batch(config.batch_size, drop_remainder=True)
    return ds.to_iter_dataset(grain.ReadOptions(num_threads=config.read_threads, prefetch_buffer_size=config.prefetch))


def transform_shares(
    data: Sequence[Record] | Iterable[Mapping[str, Any]],
    harnesses: Mapping[str, HarnessState] | None = None,
    config: SFTDataConfig | None = None,
) -> dict[str, float]:
    """The share of records each HSA transform was applied to, and the share left "original".

    Args:
      data: either trajectory records (then one epoch of `hsa_dataset(data, harnesses, config)` with
        num_epochs=1 is sampled), or elements/batches carrying "hsa_applied" ([T] or [B, T]), e.g. a
        finite `sft_dataset`.
      harnesses, config: needed when `data` are records.
    Returns:
      {transform: share of records in [0, 1] for each of `hsa.TRANSFORMS`, "original": share of
      records with no transform}; shares of transforms can sum to more than 1 (they compose).
    Raises:
      ValueError: records without `harnesses`, or no element at all.
    """
    if isinstance(data, Sequence) and data and "messages" in data[0]:
        if harnesses is None:
            raise ValueError("transform_shares: records need `harnesses`")
        config = dataclasses.replace(config or SFTDataConfig(), num_epochs=1)
        data = hsa_dataset(data, harnesses, config)
    flags = [np.asarray(e["hsa_applied"]).reshape(-1, len(hsa.TRANSFORMS)) for e in data]
    if not flags:
        raise ValueError("transform_shares: no elements")
    applied = np.concatenate(flags).astype(bool)
    shares = {t: float(applied[:, i].mean()) for i, t in enumerate(hsa.TRANSFORMS)}
    shares["original"] = float((~applied.any(axis=1)).mean())
    return shares
