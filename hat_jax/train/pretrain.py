"""The tiny base model: a byte-level BPE, then next-token pretraining on the base corpus, cached by config hash.

Run (prints one JSON line {"run_dir": <base>, "step", "loss_final", "recall_exact"}; pass run_dir to SFT,
OPD or RL as --init):

    python -m hat_jax.train.pretrain --preset micro|tiny [--steps N] [--set optim.lr=3e-3 --set n_chats=2048 ...]
        [--cache-dir DIR] [--no-progress]

The HAT report (arXiv 2608.15763, "Training, three stages") starts from a pretrained Qwen3.6-35B-A3B; at tiny
scale the base is pretrained here, on data with no live-stream content (`hat_jax.data.corpus`; why:
docs/tuning.md, "Base pretraining"). The real preset imports its base (`hat_jax.train.hf_base`).

1. Tokenizer first: `hat_jax.train.sft.bpe_tokenizer_dir`, the very cached BPE the SFT stage trains for
   the same (vocab_size, tokenizer_texts, world): texts = rendered pretraining chats + the world's rendered
   live-stream SFT records, so the vocabulary covers the live-stream text the base never trains on and SFT
   from the base tokenizes exactly as SFT from scratch would. Copied to `<base>/tokenizer`.
2. Pretraining objective: token-mean cross-entropy on EVERY non-pad token (loss_mask = attention_mask with
   position 0 zeroed, as it has no context; the reading exercises, `reading_share` of the chats: their assistant
   turns only, `answer_mask`) + lb_coef x the MoE load-balancing loss + mtp_coef x the MTP
   head's cross-entropy on the same tokens (`hat_jax.train.mtp`), through the shared trainer
   (`hat_jax.train.trainer`, the SFT loss function `sft_loss_fn`). Every token, not only the
   assistant's as in SFT: this is language-model pretraining (docs/tuning.md).
3. Rows, packed (`pack=True`, the default): each chat is one document (loss_mask 1 on every token but its
   first), cut to seq_len when longer (counted in the data state and base_report.json, logged once; with
   `truncate=False` an error naming the chat), and the documents are packed first-fit into rows of seq_len
   over `pack_bins` open rows (`hat_jax.data.packing`): several chats per row, with segment ids, so the
   model restarts attention, the Gated DeltaNet state, its conv and RoPE at each chat and no target crosses
   chats. Unpacked (`pack=False`): one chat per row, right-padded with <|endoftext|> (attention 0, loss 0).
4. Data order: stream row r is chat `np.random.default_rng([seed, e]).permutation(n_chats)[p]` with
   (e, p) = divmod(r, n_chats): epoch e visits every chat once in its own order. Packed: the documents of
   rows 0, 1, 2, ... are packed in that order (`pretraining_batches`, a Grain pipeline; the data state is
   `PackedBatches`' state: the Grain iterator's state plus the batches, documents, tokens and truncated
   documents drawn). Unpacked (`PretrainBatches`): batch k is rows k*B .. k*B+B-1, state {"batches",
   "tokens", "truncated_rows"}. Both are saved with each checkpoint and a resumed run continues at exactly
   the next batch (bit-identical to an uninterrupted run); a checkpoint of one layout does not resume the
   other (`DataStateFormatError`).

Caching (`base_checkpoint`): `<cache root>/bases/base-<hash12>` (the `hat_jax.data.world_data` cache root;
hash of the whole PretrainConfig, `INIT_SCHEME` and a fingerprint of the chats the corpus generators make,
`corpus_fingerprint`, so editing them trains a new base), a stage run directory as every --init accepts. A run
trains into `base-<hash12>.partial` with resume, measures the recall probe, writes `base_report.json`, then
renames the folder to its final name (atomic on POSIX), so the final folder only exists complete. A `flock`
on `base-<hash12>.lock` serialises concurrent callers: the second waits and finds the finished base (a killed
holder releases the lock; the next caller resumes its partial folder).

Curriculum (`init`): a base may continue another base (a `PretrainConfig`, whose cached base is built first on
a miss): its parameters are loaded from that base's last step, with a fresh optimizer and schedule, and its
digest covers the whole chain. The two must share the model and the tokenizer's key.

Recall probe: `hat_jax.train.recall_probe`, measured on the finished base, written to base_report.json.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grain
import jax
import numpy as np

from hat_jax.cache import exclusive_lock, write_text_atomic
from hat_jax.data.corpus import pretraining_chats, reading_chat_count, render_chat
from hat_jax.data.reading import KINDS as READING_KINDS
from hat_jax.data.reading import answer_mask, reading_chats, token_symbols
from hat_jax.data.reading import check_kinds as check_reading_kinds
from hat_jax.data.packing import PackedBatches, fit_document, pack_documents, refuse_packed_state
from hat_jax.data.world_data import WorldDataConfig, cache_root
from hat_jax.model.checkpoint_io import load_model_checkpoint
from hat_jax.model.config import get_config
from hat_jax.model.params import COMPUTE_DTYPES, INIT_SCHEME, LM_HEAD_INITS, init_params
from hat_jax.train.checkpoints import config_hash
from hat_jax.train.distributed import is_primary
from hat_jax.train.metrics import MetricsWriter, read_metrics
from hat_jax.train.mtp import DEFAULT_MTP_COEF, check_mtp_coef, check_mtp_model
from hat_jax.train.optim import OptimConfig
from hat_jax.train.recall_probe import reading_exercise_figures, reading_gauge_figures, recall_probe_figures
from hat_jax.train.sft import bpe_tokenizer_dir, check_tokenizer_split, run_masked_ce
from hat_jax.train.stage import (StageRun, copy_tokenizer, add_set_progress, apply_overrides, check_model_overrides,
                                 cli, config_json,
                                 parse_stage_args, stage_parser, stage_section)

log = logging.getLogger(__name__)
REPORT = "base_report.json"


@dataclasses.dataclass(frozen=True)
class PretrainConfig:
    """The base pretraining run (the config *is* the base: its hash names the cached folder).

    Attributes:
      preset, model_overrides: the model (`hat_jax.model.get_config(preset, **overrides)`); must equal the
        later stages' model, since they load the base as --init.
      world, tokenizer_texts, tokenizer_split: the tokenizer's key (`hat_jax.train.sft.bpe_tokenizer_dir`): the
        world whose live-stream SFT records the BPE covers, the number of pretraining chats in its texts and its
        pre-tokenizer split (`hat_jax.tokenizer.SPLIT_PATTERNS`). Equal to
        the SFT config's of the same scale (`configs/`), so both share one tokenizer.
      n_chats: pretraining chats (`pretraining_chats(n_chats, seed, reading_share=...)`); the stream repeats
        them in a new order each epoch. reading_share: the share of them that are short reading exercises
        (`hat_jax.data.reading`; 0 = the tool and general chats only); reading_kinds: their kinds (a non-empty
        subset of `hat_jax.data.reading.KINDS`); reading_vocab: the exercises' "results" brands and part of their
        "copy" strings are tokens of the base's own vocabulary (`hat_jax.data.reading.token_symbols`), so that
        every embedding trains, the world's merged names among them. seq_len: tokens per row. batch_size: rows per optimizer step (accum_steps
        micro-batches of batch_size / accum_steps rows).
      steps, optim: optimizer steps; AdamW + warmup-cosine schedule. lb_coef: MoE load-balancing coefficient.
      mtp_coef: weight of the MTP loss (`hat_jax.train.mtp`; >= 0, 0 skips the MTP forward; default 0.1,
        DeepSeek-V3's lambda).
      compute_dtype: "float32" or "bfloat16" (params stay fp32).
      pack: pack several chats per row (module docstring, point 3); False = one chat per row, padded.
      pack_bins: rows the first-fit packer keeps open. truncate: cut chats longer than seq_len (counted);
        False = such a chat is an error.
      probe_items: recall-probe prompts, and reading-gauge rows per family, measured at the end (0 = skip).
      log_every, ckpt_every, max_to_keep: metrics / checkpoint intervals (steps) and checkpoints kept.
      seed: init, data order and corpus seed.
      lm_head_init: how a base trained from scratch starts its lm_head (`hat_jax.model.params.LM_HEAD_INITS`):
        "normal" (transformers' init) or "embedding" (the token embedding's transpose; a base continued from
        `init` takes its parameters instead). tie_lm_head: train the lm_head as the embedding's transpose at every
        step (weight tying; needs lm_head_init "embedding"); the base's checkpoint holds both arrays, equal, as the
        architecture's lm_head is untied: SFT may keep them tied (`SFTConfig.tie_lm_head`), OPD and RL train
        them apart.
      init: None (parameters from `init_params`) or the PretrainConfig of a base to continue (module docstring,
        "Curriculum"): same model and tokenizer key, parameters from its last step, a fresh optimizer.
    """

    preset: str = "micro"
    model_overrides: tuple[tuple[str, Any], ...] = ()
    world: WorldDataConfig = WorldDataConfig()
    tokenizer_texts: int = 200
    tokenizer_split: str = "qwen"
    n_chats: int = 1024
    reading_share: float = 0.0
    reading_kinds: tuple[str, ...] = READING_KINDS
    reading_vocab: bool = False
    seq_len: int = 1024
    batch_size: int = 8
    accum_steps: int = 1
    steps: int = 100
    optim: OptimConfig = OptimConfig(lr=3e-3, warmup_steps=10)
    lb_coef: float = 0.001
    mtp_coef: float = DEFAULT_MTP_COEF
    compute_dtype: str = "float32"
    pack: bool = True
    pack_bins: int = 16
    truncate: bool = True
    probe_items: int = 64
    log_every: int = 5
    ckpt_every: int = 25
    max_to_keep: int = 2
    seed: int = 0
    lm_head_init: str = "normal"
    tie_lm_head: bool = False
    init: PretrainConfig | None = None

    def __post_init__(self):
        minimum = {"tokenizer_texts": 0, "n_chats": 1, "seq_len": 2, "batch_size": 1, "accum_steps": 1, "steps": 1,
                   "pack_bins": 1, "probe_items": 0, "log_every": 1, "ckpt_every": 1, "max_to_keep": 1, "seed": None}
        for name, low in minimum.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or (low is not None and value < low):
                want = "an int" if low is None else f"an int >= {low}"
                raise ValueError(f"PretrainConfig.{name} = {value!r}: expected {want}")
        if self.batch_size % self.accum_steps:
            raise ValueError(f"PretrainConfig.batch_size ({self.batch_size}) must be a multiple of accum_steps "
                             f"({self.accum_steps})")
        if not isinstance(self.reading_share, (int, float)) or not 0.0 <= self.reading_share <= 1.0:
            raise ValueError(f"PretrainConfig.reading_share = {self.reading_share!r}: expected a share in [0, 1]")
        if self.reading_share and not self.pack:
            raise ValueError(f"PretrainConfig.reading_share = {self.reading_share!r} needs pack=True (the reading "
                             "exercises' answer-only loss masks are built by the packed pipeline)")
        check_tokenizer_split("PretrainConfig", self.tokenizer_split)
        if not isinstance(self.reading_kinds, tuple):  # hashable: the config is a cache key
            raise ValueError(f"PretrainConfig.reading_kinds = {self.reading_kinds!r}: expected a tuple of "
                             f"{READING_KINDS}, e.g. --set 'reading_kinds=[\"label\", \"copy\"]'")
        check_reading_kinds("PretrainConfig.reading_kinds", self.reading_kinds)
        if not isinstance(self.reading_vocab, bool):
            raise ValueError(f"PretrainConfig.reading_vocab = {self.reading_vocab!r}: expected a bool")
        if self.lm_head_init not in LM_HEAD_INITS:
            raise ValueError(f"PretrainConfig.lm_head_init = {self.lm_head_init!r}; expected one of {LM_HEAD_INITS}")
        if not isinstance(self.tie_lm_head, bool):
            raise ValueError(f"PretrainConfig.tie_lm_head = {self.tie_lm_head!r}: expected a bool")
        if self.tie_lm_head and self.lm_head_init != "embedding":
            raise ValueError(f"PretrainConfig.tie_lm_head = True needs lm_head_init = 'embedding' (a tied lm_head "
                             f"starts as the embedding's transpose), got {self.lm_head_init!r}")
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"PretrainConfig.compute_dtype = {self.compute_dtype!r}; valid: {sorted(COMPUTE_DTYPES)}")
        for name, kind in (("world", WorldDataConfig), ("optim", OptimConfig)):
            if not isinstance(getattr(self, name), kind):
                raise ValueError(f"PretrainConfig.{name}: expected a {kind.__name__}, got {getattr(self, name)!r}")
        check_model_overrides("PretrainConfig", self)
        model_config = self.model_config()
        check_mtp_coef("PretrainConfig", self.mtp_coef)
        check_mtp_model("PretrainConfig", self.mtp_coef, model_config)
        if self.init is not None:
            if not isinstance(self.init, PretrainConfig):
                raise ValueError(f"PretrainConfig.init: expected a PretrainConfig (the base to continue) or None, "
                                 f"got {type(self.init).__name__}")
            for name in ("preset", "model_overrides", "world", "tokenizer_texts", "tokenizer_split"):
                if getattr(self.init, name) != getattr(self, name):
                    raise ValueError(f"PretrainConfig.init.{name} = {getattr(self.init, name)!r} differs from "
                                     f"PretrainConfig.{name} = {getattr(self, name)!r}: a continued base keeps "
                                     "the model and the tokenizer")

    def model_config(self):
        return get_config(self.preset, **dict(self.model_overrides))

    @property
    def updates(self) -> int:
        """Optimizer updates of the run: `steps` (the schedule's end when optim.total_steps is None)."""
        return self.steps

    def to_json(self) -> dict:
        data = config_json(self)
        if not self.reading_share:  # the exercise fields shape no chat, so they do not name the base
            del data["reading_kinds"], data["reading_vocab"]
        elif not self.reading_vocab:
            del data["reading_vocab"]  # a base without it keeps the name it had before the field existed
        for name, default in (("lm_head_init", "normal"), ("tie_lm_head", False)):
            if data[name] == default:
                del data[name]  # a base without it keeps the name it had before the field existed
        if self.init is None:
            del data["init"]  # a base that continues none keeps the name it had before `init` existed
        else:
            data["init"] = self.init.to_json()  # its schedule resolved, as it is hashed alone
        return data

    def digest(self) -> str:
        """12 hex digits of the hash of the config's canonical JSON, the parameter-init scheme
        (`hat_jax.model.params.INIT_SCHEME`) and the corpus fingerprint of every phase (`corpus_fingerprint`):
        names the cached base, so a change to the corpus or exercise generators trains a new one."""
        phases, config = [], self
        while config is not None:
            kinds = tuple(config.reading_kinds) if config.reading_share > 0 else ()
            phases.append(corpus_fingerprint(config.seed, kinds, config.reading_vocab and bool(kinds)))
            config = config.init
        return config_hash({**self.to_json(), "init_scheme": INIT_SCHEME, "corpus": phases})[:12]


_FINGERPRINT_SYMBOLS = ("甲乙", "丙", "丁戊己", "alpha", "beta", "gamma")  # stand-ins for a vocabulary's


@functools.lru_cache(maxsize=64)
def corpus_fingerprint(seed: int, reading_kinds: tuple[str, ...], reading_vocab: bool = False) -> str:
    """12 hex digits of the hash of a sample of what the corpus generators make for `seed`: 8 pretraining chats
    and 4 reading exercises per kind of `reading_kinds` (none when empty; with `reading_vocab`, drawing from six
    stand-in symbols, as the base's vocabulary is covered by its tokenizer's key). Not the corpus itself (tens
    of thousands of chats); enough to change whenever a generator does. Milliseconds; cached per argument."""
    symbols = _FINGERPRINT_SYMBOLS if reading_vocab else ()
    reading = reading_chats(4 * len(reading_kinds), seed, kinds=reading_kinds, symbols=symbols) if reading_kinds else []
    sample = {"chats": pretraining_chats(8, seed), "reading": reading}
    if reading_vocab:
        sample["reading_vocab"] = True
    return config_hash(sample)[:12]


# ---------------------------------------------------------------------------------------------- data

def pretraining_rows(token_ids: Sequence[Sequence[int]], seq_len: int, pad_id: int) -> dict[str, np.ndarray]:
    """One document per row, right-padded / truncated to seq_len (module docstring, point 3).

    Args:
        token_ids: B documents' token ids. seq_len: row length. pad_id: the pad token.
    Returns:
        {"input_ids", "attention_mask" (1 on the document's tokens), "loss_mask" (= attention_mask, 0 at
        t = 0): int32 [B, seq_len]; "truncated": int8 [B] (1 when the document was longer than seq_len)}.
    """
    b = len(token_ids)
    out = {"input_ids": np.full((b, seq_len), pad_id, np.int32), "attention_mask": np.zeros((b, seq_len), np.int32),
           "truncated": np.zeros(b, np.int8)}
    for i, ids in enumerate(token_ids):
        n = min(len(ids), seq_len)
        out["input_ids"][i, :n] = np.asarray(ids[:n], np.int32)
        out["attention_mask"][i, :n] = 1
        out["truncated"][i] = len(ids) > seq_len
    out["loss_mask"] = out["attention_mask"].copy()
    out["loss_mask"][:, 0] = 0
    return out


class PretrainBatches:
    """Host batches of `pretraining_rows` over the chats, in the epoch order of the module docstring (point 4).

    An iterator (never exhausted) with `get_state()` -> {"batches", "tokens", "truncated_rows"} (JSON) and
    `set_state(state)`; `tokens` counts real (attention) tokens drawn so far.
    """

    def __init__(self, chats: Sequence[tuple[list, list]], tokenizer, seq_len: int, batch_size: int, seed: int):
        if not chats:
            raise ValueError("PretrainBatches: no chats")
        self.chats, self.tokenizer, self.seed = chats, tokenizer, seed
        self.seq_len, self.batch_size = seq_len, batch_size
        self.pad_id = int(tokenizer.pad_token_id or 0)
        self.batches = self.tokens = self.truncated = 0

    def chat_index(self, row: int) -> int:
        """The chat drawn as stream row `row` (0-based; `chat_order`)."""
        return chat_order(len(self.chats), self.seed, row)

    @property
    def documents(self) -> int:
        """Chats drawn so far (one per row)."""
        return self.batches * self.batch_size

    def encode(self, index: int) -> list[int]:
        messages, tools = self.chats[index]
        return list(self.tokenizer(render_chat(messages, tools), add_special_tokens=False)["input_ids"])

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        start = self.batches * self.batch_size
        docs = [self.encode(self.chat_index(r)) for r in range(start, start + self.batch_size)]
        batch = pretraining_rows(docs, self.seq_len, self.pad_id)
        cut = int(batch["truncated"].sum())
        if cut and not self.truncated:
            log.warning("pretraining rows longer than seq_len %d are truncated (first in batch %d: %s tokens); "
                        "counted in the data state and base_report.json", self.seq_len, self.batches,
                        max(len(d) for d in docs))
        self.batches += 1
        self.tokens += int(batch["attention_mask"].sum())
        self.truncated += cut
        return batch

    def get_state(self) -> dict:
        return {"batches": self.batches, "tokens": self.tokens, "truncated_rows": self.truncated}

    def set_state(self, state: dict) -> None:
        """Raises DataStateFormatError for a packed pipeline's state, ValueError naming a missing or non-integer
        key."""
        refuse_packed_state(state, "pretraining")
        for key in ("batches", "tokens", "truncated_rows"):
            if not isinstance(state.get(key), int) or state[key] < 0:
                raise ValueError(f"pretraining data state: {key!r} must be an int >= 0, got {state.get(key)!r}")
        self.batches, self.tokens, self.truncated = state["batches"], state["tokens"], state["truncated_rows"]


def chat_order(n_chats: int, seed: int, row: int) -> int:
    """The chat drawn as stream row `row` (0-based): epoch e = row // n_chats visits the chats in
    `np.random.default_rng([seed, e]).permutation(n_chats)` (module docstring, point 4)."""
    epoch, pos = divmod(row, n_chats)
    return int(_epoch_permutation(n_chats, seed, epoch)[pos])


@functools.lru_cache(maxsize=4)
def _epoch_permutation(n_chats: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(n_chats)




class ChatDocument(grain.transforms.Map):
    """Grain map: stream row -> that chat as one document (`packing.fit_document`, cut to seq_len; a truncation
    is logged once). loss_mask: 1 on every token but the first; for the chats from index `answers_from` on (the
    reading exercises), 1 on the assistant turns only (`answer_mask`): their listings are random names whose
    loss is irreducible noise, their answers the reading decisions."""

    def __init__(self, chats: Sequence[tuple[list, list]], tokenizer, seq_len: int, seed: int, truncate: bool,
                 answers_from: int | None = None):
        self.chats, self.tokenizer, self.seq_len, self.seed, self.truncate = chats, tokenizer, seq_len, seed, truncate
        self.answers_from = len(chats) if answers_from is None else answers_from
        self.logged = False

    def map(self, row: int) -> dict[str, np.ndarray]:
        index = chat_order(len(self.chats), self.seed, int(row))
        messages, tools = self.chats[index]
        text = render_chat(messages, tools)
        if index >= self.answers_from:
            enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            ids, mask = enc["input_ids"], answer_mask(text, enc["offset_mapping"])
        else:
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            mask = np.ones(len(ids), np.int32)
        mask[:1] = 0  # the first token has no context
        doc = fit_document(ids, mask, self.seq_len, truncate=self.truncate,
                           name=f"pretraining chat {index} (stream row {row})")
        if doc["truncated"] and not self.logged:
            self.logged = True
            log.warning("pretraining chats longer than seq_len %d are truncated (first: chat %d, %d tokens); counted "
                        "in the data state and base_report.json", self.seq_len, index, len(ids))
        return doc


def pretraining_batches(chats: Sequence[tuple[list, list]], tokenizer, config: PretrainConfig) -> PackedBatches:
    """The packed pretraining batches (module docstring, points 3-4): stream rows -> `ChatDocument` -> first-fit
    packing over config.pack_bins rows of config.seq_len -> batches of config.batch_size rows.

    Returns:
        a `PackedBatches` (never exhausted) of {"input_ids", "loss_mask", "segment_ids", "positions": int32 [B,
        seq_len], "documents", "truncated": int32 [B] (chats, truncated chats per row)}.
    Raises:
        ValueError: no chats. When iterated: a chat longer than seq_len with config.truncate False.
    """
    if not chats:
        raise ValueError("pretraining_batches: no chats")
    docs = grain.MapDataset.range(sys.maxsize).map(
        ChatDocument(chats, tokenizer, config.seq_len, config.seed, config.truncate,
                     answers_from=len(chats) - reading_chat_count(len(chats), config.reading_share)))
    docs = docs.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=4 * config.pack_bins))
    rows = pack_documents(docs, config.seq_len, bins=config.pack_bins, pad_id=int(tokenizer.pad_token_id or 0),
                          sum_features=("truncated",))
    return PackedBatches(iter(rows.batch(config.batch_size, drop_remainder=True)), "pretraining",
                         geometry={"seq_len": config.seq_len, "pack_bins": config.pack_bins})


# ---------------------------------------------------------------------------------------------- training

def _base_tokenizer(config: PretrainConfig, out: Path):
    """`<out>/tokenizer` (a resumed run) or the shared cached BPE copied there; loaded and size-checked."""
    from hat_jax.tokenizer import load_tokenizer

    vocab = config.model_config().vocab_size
    target = source = out / "tokenizer"
    if not target.is_dir():
        source = bpe_tokenizer_dir(vocab, config.tokenizer_texts, config.world, split=config.tokenizer_split)
        source = copy_tokenizer(source, target)
    tok = load_tokenizer(source)
    if len(tok) > vocab:
        raise ValueError(f"tokenizer {str(target)!r} has {len(tok)} tokens, more than the model's vocab_size {vocab}")
    return tok


def train_base(config: PretrainConfig, out_dir: str | Path, *, progress: bool = True,
               cache_dir: str | Path | None = None) -> dict:
    """Trains (or resumes) the base in `out_dir`, measures the recall probe, writes `base_report.json`.

    `config.init`'s base (a continued base) is found or built by `base_checkpoint(config.init, cache_dir=...)`.

    Returns:
        the report: {"config_hash", "steps", "resumed_from" (step or None), "loss_first" / "loss_final" (the
        first / last logged window's mean loss) and their steps, "loss_curve" [[step, loss]], "wall_s" (this
        call: tokenizer, data, training, probe; building `config.init`'s base here included), "init_wall_s" (the
        seconds `config.init`'s base took, all its phases, as its report gives them; None when it continues
        none), "chain_wall_s" (the base's phases in all: this call less any time building `config.init`'s base,
        plus init_wall_s; a lower bound when this phase was resumed, or when an init's report predates the
        field and gives only its last phase), "tokenizer_s", "train_s" (compilation included), "probe_s",
        "tokens" (real tokens trained, all calls),
        "tokens_per_s" (real tokens per second, steady state of this call, compilation excluded), "truncated_rows"
        (chats cut to seq_len), "rows" (rows trained), "documents" (chats trained; > rows when packed), "probe",
        "reading_gauge" (`reading_gauge_figures`), "reading" (`reading_exercise_figures` on probe_items / 4 fresh
        chats per reading kind when reading_share > 0, else empty); their time is in probe_s}.
    Raises:
        NonFiniteLossError: a NaN/inf loss. ConfigMismatchError: `out_dir` holds another config's checkpoints.
    """
    t_start = time.perf_counter()
    run = StageRun("pretrain", out_dir, config.to_json(), resume=True, logger=log)
    out = run.out
    out.mkdir(parents=True, exist_ok=True)
    model_config = config.model_config()
    tokenizer = _base_tokenizer(config, out)
    t_tok = time.perf_counter() - t_start
    symbols = token_symbols(tokenizer) if config.reading_vocab else ()
    chats = pretraining_chats(config.n_chats, config.seed, reading_share=config.reading_share,
                              reading_kinds=config.reading_kinds, reading_symbols=symbols)
    if config.pack:
        batches = pretraining_batches(chats, tokenizer, config)
    else:
        batches = PretrainBatches(chats, tokenizer, config.seq_len, config.batch_size, config.seed)
    params = None
    t_init = time.perf_counter()
    if run.existing is None:
        params = (init_params(model_config, jax.random.key(config.seed), lm_head_init=config.lm_head_init)
                  if config.init is None
                  else _continued_params(config.init, cache_dir, progress=progress))
    init_s = time.perf_counter() - t_init if config.init is not None else 0.0
    init_wall = _chain_wall_s(config.init, cache_dir)
    t_train = time.perf_counter()
    state = run_masked_ce(run, config, model_config, params, batches, desc="pretrain", progress=progress,
                          tie_lm_head=config.tie_lm_head)
    train_s = time.perf_counter() - t_train
    t_probe = time.perf_counter()
    probe = recall_probe_figures(state.params, model_config, tokenizer, config.probe_items,
                                 dtype=COMPUTE_DTYPES[config.compute_dtype])
    gauge = reading_gauge_figures(state.params, model_config, tokenizer, config.probe_items,
                                  dtype=COMPUTE_DTYPES[config.compute_dtype])
    reading = reading_exercise_figures(state.params, model_config, tokenizer,
                                       -(-config.probe_items // 4) if config.reading_share else 0,
                                       config.reading_kinds, dtype=COMPUTE_DTYPES[config.compute_dtype],
                                       symbols=symbols)
    rows = [r for r in read_metrics(out) if r.get("train/loss") is not None]
    rates = [r["train/tokens_per_s"] for r in rows if r.get("train/tokens_per_s")]
    step = int(jax.device_get(state.step))
    report = {
        "config_hash": config.digest(), "steps": step, "resumed_from": run.existing,
        "loss_first": rows[0]["train/loss"] if rows else None, "loss_first_step": rows[0]["step"] if rows else None,
        "loss_final": rows[-1]["train/loss"] if rows else None, "loss_final_step": rows[-1]["step"] if rows else None,
        "loss_curve": [[r["step"], round(r["train/loss"], 4)] for r in rows],
        "wall_s": round(time.perf_counter() - t_start, 2), "init_wall_s": init_wall,
        "chain_wall_s": round(time.perf_counter() - t_start - init_s + (init_wall or 0.0), 2),
        "tokenizer_s": round(t_tok, 2),
        "train_s": round(train_s, 2), "probe_s": round(time.perf_counter() - t_probe, 2), "tokens": batches.tokens,
        "tokens_per_s": round(float(np.mean(rates)), 1) if rates else None,
        "truncated_rows": batches.truncated, "rows": batches.batches * config.batch_size,
        "documents": batches.documents, "probe": probe, "reading_gauge": gauge,
        "reading": reading,
    }
    if is_primary():  # one process writes the run's files
        with MetricsWriter(out) as writer:
            writer.scalars(step, {"eval/recall_exact": probe["exact"], "eval/recall_first_token": probe["first_token"],
                                  "eval/recall_name_nll": probe["name_nll"],
                                  **{f"eval/gauge_{family}": v for family, v in gauge["exact"].items()},
                                  **{f"eval/reading_{kind}_exact": v["exact"] for kind, v in reading["kinds"].items()}})
            writer.text("eval/recall_probe", "```\n" + json.dumps(probe, indent=1) + "\n```", step)
        write_text_atomic(out / REPORT, json.dumps(report, indent=1) + "\n")
    log.info("base %s: %d steps, loss %.3f (step %s) -> %.3f (step %s), %.0f s (train %.0f s, %s tok/s); recall "
             "probe (n=%d): exact %.3f, first token %.3f, name NLL %.3f; reading gauge (exact names, %d rows each): %s",
             out.name.removesuffix(".partial"), step, report["loss_first"] or 0,
             report["loss_first_step"], report["loss_final"] or 0, report["loss_final_step"], report["wall_s"],
             train_s, report["tokens_per_s"], probe["n"], probe["exact"], probe["first_token"], probe["name_nll"],
             gauge["rows"], ", ".join(f"{f} {v:.3f}" for f, v in gauge["exact"].items()))
    if reading["kinds"]:
        log.info("reading exercises (%d fresh chats per kind; exact answers / first answer token / answer tokens): %s",
                 reading["chats_per_kind"], "; ".join(f"{k} {v['exact']:.3f} / {v['first_token']:.3f} / "
                                                       f"{v['token_acc']:.3f}" for k, v in reading["kinds"].items()))
    return report


def _finished(final: Path) -> bool:
    if not final.exists():
        return False
    if not (final / REPORT).is_file():
        raise FileExistsError(f"{str(final)!r} exists but holds no {REPORT}, so it is not a finished base; "
                              "remove it to rebuild")
    return True


def _base_folder(config: PretrainConfig, cache_dir: str | Path | None) -> Path:
    """`<cache_dir>/base-<hash12>` (default cache_dir `<cache root>/bases`), resolved: where `config`'s base is."""
    root = Path(cache_dir) if cache_dir is not None else cache_root() / "bases"
    return root.resolve() / f"base-{config.digest()}"


def _chain_wall_s(init: PretrainConfig | None, cache_dir: str | Path | None) -> float | None:
    """The seconds `init`'s cached base took, every phase of it (its report's "chain_wall_s", or "wall_s" for a
    report written before that field); None when `init` is None or its report is not there."""
    if init is None:
        return None
    report = _base_folder(init, cache_dir) / REPORT
    if not report.is_file():
        return None
    data = json.loads(report.read_text())
    return data.get("chain_wall_s", data.get("wall_s"))


def _continued_params(init: PretrainConfig, cache_dir: str | Path | None, *, progress: bool) -> dict:
    """The parameters of the last step of `init`'s base (`base_checkpoint`: built first on a miss)."""
    path = base_checkpoint(init, cache_dir=cache_dir, progress=progress)
    _, params = load_model_checkpoint(path)
    log.info("continuing base %s (step %d)", path.name, init.steps)
    return params


def base_checkpoint(config: PretrainConfig, *, cache_dir: str | Path | None = None, progress: bool = True) -> Path:
    """The pretrained base of `config`: `<cache_dir>/base-<hash12>` (default cache_dir `<cache root>/bases`),
    trained on a miss (module docstring: partial folder, resume, atomic rename, lock).

    Returns:
        the base folder (a stage run dir with model_config.json, tokenizer/, base_report.json), for --init.
    Raises:
        FileExistsError: the final folder exists without a report (not made by this function).
        NonFiniteLossError: training diverged (the partial folder keeps the last good checkpoint).
    """
    final = _base_folder(config, cache_dir)
    if _finished(final):
        log.info("cached base %s", final)
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(final.with_name(final.name + ".lock")):
        if _finished(final):  # built by the process we waited for
            log.info("cached base %s (built by another process)", final)
            return final
        partial = final.with_name(final.name + ".partial")
        train_base(config, partial, progress=progress, cache_dir=final.parent)
        os.rename(partial, final)
    return final


# ---------------------------------------------------------------------------------------------- CLI

def main(argv: Sequence[str] | None = None) -> int:
    parser = stage_parser("pretrain", __doc__)
    parser.add_argument("--steps", type=int, help="optimizer steps (also the cosine schedule's end)")
    parser.add_argument("--cache-dir", help="folder of the cached bases (default <cache root>/bases)")
    add_set_progress(parser, "seq_len=512, optim.lr=3e-3, n_chats=2048")
    args = parse_stage_args(parser, argv)
    config = stage_section(args.preset, "base.pretrain")
    if args.steps is not None:
        config = dataclasses.replace(config, steps=args.steps)
    config = apply_overrides(config, args.set)
    path = base_checkpoint(config, cache_dir=args.cache_dir, progress=not args.no_progress)
    report = json.loads((path / REPORT).read_text())
    print(json.dumps({"run_dir": str(path), "step": report["steps"], "loss_final": report["loss_final"],
                      "recall_exact": report["probe"]["exact"]}))
    return 0


if __name__ == "__main__":
    cli(main, compile_cache=True)
