"""The SFT data pipeline: trajectory records -> HSA (Grain `random_map`) -> tokens + loss mask -> batches.

Variant implemented and why (HSA-SFT, stage 1 of the HAT report, arXiv 2608.15763 (TaoLive, 2026),
"Training, three stages"):
- `grain.MapDataset.source(records).shuffle(seed).random_map(HSAStep, seed)`: Grain derives each
  element's random generator from the pipeline seed and the element's index, so HSA is seeded per
  record and a resumed run sees the same augmented stream. With probability `p_hsa` a record is
  augmented (`hsa.compose` on its harness, the trajectory rewritten with the name map), otherwise it
  keeps the original harness: the paper mixes original and augmented harnesses (why it matters at tiny
  scale: docs/tuning.md, "HSA-SFT").
- Hook-parameter changes that change behaviour (`hsa.behaviour_changed` on the trajectory) need the
  oracle: with a `reroll` callable the trajectory is re-rolled under the new harness; without one the
  draw is recomposed without "hook_params" (same seed), so no record claims a behaviour it lacks.
- Tokenisation: `hat_jax.harness.render.render_tokens(tokenizer, harness, messages)` (the system
  prompt is re-rendered from the record's harness), then truncation to `seq_len` (`TokenizeDocument`),
  which keeps the first `seq_len` tokens and is never silent: each document carries `truncated` and
  `num_tokens` (its length before truncation), and the first truncation is logged. With
  `truncate=False` a longer trajectory is an error naming its task id.
- Rows, packed (`pack=True`, the default): `hat_jax.data.packing.pack_documents`, first fit over
  `pack_bins` open rows: several trajectories per row with "segment_ids" and per-document
  "positions" (the fields: `sft_dataset`). Unpacked (`pack=False`): one trajectory per row, right-padded
  (`TokenizeAndPad`: pad id = tokenizer.pad_token_id, loss_mask 0 and attention_mask 0 on padding).
- Batches: `batch(batch_size, drop_remainder=True)` of an IterDataset; the iterator's `get_state()`
  is a small JSON-serialisable dict (checkpoints store it) and `set_state` resumes at exactly the
  next batch (packed: `sft_batches`).
Each element records which transforms were applied (`hsa_applied`, int8 over `hsa.transform_names()`), so
`transform_shares` reports the share of each transform in a sampled epoch.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar

import grain
import numpy as np

from hat_jax.data.host_rows import HostRows, TakeRows
from hat_jax.data.packing import PackedBatches, fit_document, pack_documents
from hat_jax.data.recovery import insert_misread
from hat_jax.harness import hsa
from hat_jax.harness.state import HarnessState
from hat_jax.sim.env import EnvConfig

log = logging.getLogger(__name__)

Record = Mapping[str, Any]  # {"messages": [...], "task_id": str, "harness_id": str, "seed": int, ...}
Reroll = Callable[[Record, HarnessState, int], Sequence[Mapping[str, Any]]]
RECORD_KEYS: tuple[str, ...] = ("messages", "task_id", "harness_id", "seed")


@dataclasses.dataclass(frozen=True)
class SFTDataConfig:
    """The SFT pipeline's settings.

    Attributes:
      seq_len: tokens per row (longer trajectories are truncated, shorter ones packed or padded).
      batch_size: rows per batch (the last partial batch of the run is dropped).
      seed: shuffle and HSA seed.
      p_hsa: probability that a record is augmented (else it keeps its original harness).
      hsa: the HSA transforms' configuration.
      split: "train" or "heldout" (held-out families, for building Harness-Variant QA data).
      num_epochs: passes over the records (each reshuffled and re-augmented); None = forever.
      shuffle: shuffle the records (per epoch).
      read_threads, prefetch: `grain.ReadOptions` of the iterator.
      pack: pack several trajectories per row (module docstring); False = one per row, right-padded.
      pack_bins: rows the first-fit packer keeps open (more fill rows better).
      truncate: cut trajectories longer than seq_len (counted); False = such a trajectory is an error.
      p_recovery: probability that an HSA-augmented record gets a misread call of the original harness, its
        refusal and the retry (`hat_jax.data.recovery.insert_misread`; the misread turn is out of the loss), where
        one of its calls is written differently under the variant. 0 in every preset: at 0.5 small's model
        learns the retry's wording but not to copy the key from the refusal (docs/tuning.md, "Recovery turns").
    """

    OMITTED_AT_DEFAULT: ClassVar[tuple[str, ...]] = ("p_recovery",)

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
    pack: bool = True
    pack_bins: int = 16
    truncate: bool = True
    p_recovery: float = 0.0

    def __post_init__(self):
        if self.seq_len < 1 or self.batch_size < 1 or self.pack_bins < 1:
            raise ValueError(f"SFTDataConfig: seq_len ({self.seq_len}), batch_size ({self.batch_size}) and pack_bins "
                             f"({self.pack_bins}) must be >= 1")
        for name in ("p_hsa", "p_recovery"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise ValueError(f"SFTDataConfig.{name} = {value!r}: expected a probability, a number in [0, 1]")
        if self.p_recovery > 0 and self.p_hsa == 0:
            raise ValueError(f"SFTDataConfig.p_recovery = {self.p_recovery} needs p_hsa > 0: recovery turns are written "
                             f"into HSA-rewritten records only, and p_hsa = 0 rewrites none")
        if self.split not in ("train", "heldout"):
            raise ValueError(f"SFTDataConfig.split = {self.split!r}: expected 'train' or 'heldout'")
        if self.num_epochs is not None and self.num_epochs < 1:
            raise ValueError(f"SFTDataConfig.num_epochs = {self.num_epochs}: expected >= 1 or None")


class HSAStep(grain.transforms.RandomMap):
    """Grain random map: record -> record with "harness", rewritten "messages" and "hsa_applied".

    `env_config` is the `hat_jax.sim.env.EnvConfig` the records were rolled out under (None = its defaults): a
    recovery turn (config.p_recovery) is only written where the retry stays inside its turn limits.
    """

    def __init__(self, harnesses: Mapping[str, HarnessState], config: SFTDataConfig, reroll: Reroll | None = None,
                 env_config: EnvConfig | None = None):
        self.harnesses = dict(harnesses)
        self.config = config
        self.reroll = reroll
        self.env_config = EnvConfig() if env_config is None else env_config

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
            rng_recovery = random.Random(seed + 2)
            if applied and rng_recovery.random() < self.config.p_recovery:
                limits = self.env_config
                messages = insert_misread(messages, old, new, rng_recovery, max_tool_rounds=limits.max_tool_rounds,
                                          max_skill_turns=limits.max_skill_turns) or messages
        flags = np.asarray([t in applied for t in hsa.transform_names()], dtype=np.int8)
        return {**element, "messages": messages, "harness": new, "hsa_applied": flags}


class TokenizeDocument(grain.transforms.Map):
    """Grain map: HSA'd record -> one document {"input_ids", "loss_mask": int32 [min(n, seq_len)],
    "num_tokens": int32 (n, before truncation), "truncated": int32 (1 when n > seq_len), "hsa_applied":
    int8 [len(hsa.transform_names())]}.

    Truncation keeps the first `seq_len` tokens and is never silent: each instance logs one warning, the first
    time it truncates a document, and one more the first time a document keeps no loss token at all (all its
    assistant tokens were cut off), with the document's figures and the running counts; `counts` holds the
    running totals ("rows", "truncated", "no_loss_tokens") of this instance.

    Raises (when mapping): ValueError naming the task id: a trajectory longer than seq_len with
    truncate=False.
    """

    def __init__(self, tokenizer: Any, seq_len: int, render_tokens: Callable | None = None, truncate: bool = True):
        self.tokenizer = tokenizer
        self.seq_len = seq_len
        self.render_tokens = render_tokens
        self.truncate = truncate
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
        doc = fit_document(ids, mask, self.seq_len, truncate=self.truncate,
                           name=f"of SFT record {element.get('task_id', '?')!r}")
        self._count(element, int(doc["num_tokens"]), int(np.sum(mask)), int(doc["loss_mask"].sum()))
        return {**doc, "hsa_applied": element["hsa_applied"]}


class TokenizeAndPad(TokenizeDocument):
    """Grain map: HSA'd record -> one right-padded row {"input_ids", "loss_mask", "attention_mask": int32
    [seq_len], "num_tokens": int32 (before truncation), "truncated": int8 (1 when num_tokens > seq_len),
    "hsa_applied": int8 [len(hsa.transform_names())]} (the unpacked layout; logging and errors as `TokenizeDocument`).
    """

    def map(self, element: Mapping[str, Any]) -> dict:
        doc = super().map(element)
        n = len(doc["input_ids"])
        out = {
            "input_ids": np.full(self.seq_len, self.pad_id, np.int32),
            "loss_mask": np.zeros(self.seq_len, np.int32),
            "attention_mask": np.zeros(self.seq_len, np.int32),
        }
        out["input_ids"][:n], out["loss_mask"][:n], out["attention_mask"][:n] = doc["input_ids"], doc["loss_mask"], 1
        out["num_tokens"] = doc["num_tokens"]
        out["truncated"] = np.int8(doc["truncated"])
        out["hsa_applied"] = doc["hsa_applied"]
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
    env_config: EnvConfig | None = None,
) -> grain.MapDataset:
    """The pipeline up to HSA: source -> shuffle -> `HSAStep` (-> repeat for num_epochs != 1).

    Args:
      records: trajectory records (keys `RECORD_KEYS`; messages in OpenAI format under the record's
        harness).
      harnesses: harness_id -> HarnessState.
      config: pipeline settings. reroll: (record, new harness, seed) -> messages, the oracle
        re-rolling a trajectory whose behaviour a hook change altered; None recomposes without
        "hook_params" instead. env_config: the `EnvConfig` the records were rolled out under, whose turn limits
        bound a recovery turn (`HSAStep`); None = the defaults.
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
    ds = ds.random_map(HSAStep(harnesses, config, reroll, env_config), seed=config.seed)
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
    rows: Sequence[int] | None = None,
    env_config: EnvConfig | None = None,
) -> grain.IterDataset:
    """The SFT pipeline: `hsa_dataset` -> `TokenizeDocument` -> packed rows (or `TokenizeAndPad`, unpacked) ->
    batch(drop_remainder) -> IterDataset.

    Args:
      records, harnesses, config, reroll, env_config: as in `hsa_dataset`.
      tokenizer: a fast Hugging Face tokenizer with the Qwen-format chat template.
      render_tokens: (tokenizer, harness, messages) -> (ids, loss_mask); default
        `hat_jax.harness.render.render_tokens`.
      rows: this process's rows of each global batch of config.batch_size (`hat_jax.data.host_rows`; a
        multi-process run), None for all of them. Unpacked, the process reads only those records; packed, it
        packs every document (the global row order) and keeps those rows. Batches then have len(rows) rows.
    Returns:
      a `grain.IterDataset` of batches. Packed (config.pack): {"input_ids", "loss_mask", "segment_ids",
      "positions": int32 [B, seq_len], "documents": int32 [B] (trajectories per row), "truncated": int32 [B]
      (truncated trajectories per row), "hsa_applied": int32 [B, len(hsa.transform_names())] (trajectories of the row
      each transform was applied to), "hsa_any": int32 [B] (trajectories with any transform)}; wrap its
      iterator in `packing.PackedBatches` (`sft_batches`). Unpacked: {"input_ids", "loss_mask",
      "attention_mask": int32 [B, seq_len], "num_tokens": int32 [B] (lengths before truncation),
      "truncated": int8 [B] (1 for a row cut to seq_len), "hsa_applied": int8 [B, len(hsa.transform_names())]}.
      `iter(ds)` gives an iterator with `get_state()` (JSON-serialisable) / `set_state(state)`. Truncation is
      logged (`TokenizeDocument`).
    Raises:
      ValueError: no records, or fewer records than one batch (unpacked). When iterated: a trajectory longer
        than seq_len with truncate=False (names its task id).
    """
    ds = hsa_dataset(records, harnesses, config, reroll, env_config)
    if config.num_epochs is not None and len(records) * config.num_epochs < config.batch_size and not config.pack:
        raise ValueError(
            f"sft_dataset: {len(records)} records x {config.num_epochs} epochs < one batch of {config.batch_size}"
        )
    options = grain.ReadOptions(num_threads=config.read_threads, prefetch_buffer_size=config.prefetch)
    if not config.pack:
        ds = ds.map(TokenizeAndPad(tokenizer, config.seq_len, render_tokens, config.truncate))
        if rows is not None:
            ds = HostRows(ds, config.batch_size, rows)
            return ds.batch(len(ds.rows), drop_remainder=True).to_iter_dataset(options)
        return ds.batch(config.batch_size, drop_remainder=True).to_iter_dataset(options)
    tokenize = TokenizeDocument(tokenizer, config.seq_len, render_tokens, config.truncate)
    docs = ds.map(tokenize).map(_with_hsa_any).to_iter_dataset(options)
    packed = pack_documents(docs, config.seq_len, bins=config.pack_bins, pad_id=tokenize.pad_id,
                            sum_features=("truncated", "hsa_applied", "hsa_any"))
    batches = packed.batch(config.batch_size, drop_remainder=True)
    return batches if rows is None else batches.map(TakeRows(rows, config.batch_size))


def _with_hsa_any(doc: dict) -> dict:
    return {**doc, "hsa_any": np.int32(np.any(doc["hsa_applied"] != 0))}


def sft_batches(dataset: grain.IterDataset, config: SFTDataConfig):
    """The iterator over `sft_dataset(..., config)`: a `packing.PackedBatches` when config.pack (its state
    carries the packed format tag and the running counts: documents, tokens, truncated documents), else the
    Grain iterator itself."""
    geometry = {"data.seq_len": config.seq_len, "data.pack_bins": config.pack_bins}
    return PackedBatches(iter(dataset), "SFT", geometry) if config.pack else iter(dataset)


def transform_shares(
    data: Sequence[Record] | Iterable[Mapping[str, Any]],
    harnesses: Mapping[str, HarnessState] | None = None,
    config: SFTDataConfig | None = None,
) -> dict[str, float]:
    """The share of records each HSA transform was applied to, and the share left "original".

    Args:
      data: either trajectory records (then one epoch of `hsa_dataset(data, harnesses, config)` with
        num_epochs=1 is sampled), or elements/batches carrying "hsa_applied" ([T] or [B, T] flags), e.g. a
        finite unpacked `sft_dataset`, or packed batches (with "documents": "hsa_applied" and "hsa_any"
        are then counts of the row's trajectories).
      harnesses, config: needed when `data` are records.
    Returns:
      {transform: share of records in [0, 1] for each of `hsa.transform_names()`, "original": share of
      records with no transform}; shares of transforms can sum to more than 1 (they compose).
    Raises:
      ValueError: records without `harnesses`, or no element at all.
    """
    if isinstance(data, Sequence) and data and "messages" in data[0]:
        if harnesses is None:
            raise ValueError("transform_shares: records need `harnesses`")
        config = dataclasses.replace(config or SFTDataConfig(), num_epochs=1)
        data = hsa_dataset(data, harnesses, config)
    k = len(hsa.transform_names())
    applied, docs, original = np.zeros(k), 0, 0
    for e in data:
        if "documents" in e:  # a packed row or batch: counts of its trajectories
            n = int(np.sum(e["documents"]))
            applied += np.asarray(e["hsa_applied"]).reshape(-1, k).sum(axis=0)
            original += n - int(np.sum(e["hsa_any"]))
        else:
            flags = np.asarray(e["hsa_applied"]).reshape(-1, k).astype(bool)
            n = flags.shape[0]
            applied += flags.sum(axis=0)
            original += int((~flags.any(axis=1)).sum())
        docs += n
    if not docs:
        raise ValueError("transform_shares: no elements")
    shares = {t: float(applied[i] / docs) for i, t in enumerate(hsa.transform_names())}
    shares["original"] = float(original / docs)
    return shares
