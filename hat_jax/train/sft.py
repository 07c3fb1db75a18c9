"""The SFT stage: masked token cross-entropy on assistant tokens over the Grain SFT pipeline, HSA on or off.

Run (from a fresh init, or from a checkpoint with --init, e.g. the base or a previous stage's run dir):

    python -m hat_jax.train.sft --preset micro --out runs/sft --steps 20 [--hsa on|off] [--init CKPT]
        [--resume [--force]] [--set data.seq_len=3072 --set optim.lr=1e-3 ...]

Objective (the HAT report, arXiv 2608.15763 (TaoLive, 2026), "Training, three stages", stage 1 HSA-SFT):
per micro-batch `masked_token_ce_sum(logits, input_ids,
loss_mask)` (`hat_jax.train.losses`; the logits computed only where a block of positions predicts a loss token,
or over vocabulary chunks with `vocab_chunk`; loss_mask = 1 on assistant-generated tokens only, as
`hat_jax.harness.render.render_tokens` marks them), summed over the accumulated micro-batches and divided by
the total number of loss tokens (`hat_jax.train.trainer`), plus lb_coef x the MoE load-balancing loss
(transformers' `router_aux_loss_coef` convention, padding excluded), plus mtp_coef x the MTP head's
cross-entropy on the same loss tokens (`hat_jax.train.mtp`; skipped at mtp_coef = 0).

Data: `hat_jax.data.world_data.sft_records(config.world)` (rejection-sampled oracle trajectories under the
production harness) through `hat_jax.data.pipeline.sft_dataset`: trajectories truncated to `data.seq_len`
and packed several per row (`data.pack`, on by default; `hat_jax.data.packing`), the model run with their
segment ids so no attention, Gated DeltaNet state or conv crosses documents, and no target crosses them
(`sft_loss_fn`); `data.pack=false` gives one trajectory per row, right-padded. The stage's
harness switch is `data.p_hsa`: "original" harness = 0 (`--hsa off`), "hsa" = p > 0 (`--hsa on`
sets the config's mixing probability; the paper mixes original and augmented harnesses).

Tokenizer: the --init checkpoint's `tokenizer/` folder when it has one; otherwise a byte-level BPE of the
model's vocab_size trained on `tokenizer_training_texts` + the rendered SFT records, cached under
`<cache root>/tokenizers/bpe-<hash>` (cache root of `hat_jax.data.world_data`; `bpe_tokenizer_dir`, shared
with the base pretraining of `hat_jax.train.pretrain`). It is copied to
`<out>/tokenizer`, which a resumed run reuses. seq_len must exceed the production harness's system prompt,
or rows carry no loss tokens; the scale configs are sized for that (`configs/micro.py` gives its length).

The run directory `--out` is the `StageCheckpointer` root (checkpoints, model_config.json, tokenizer/) and
the TensorBoard run directory (`hat_jax.train.metrics`); `load_model_checkpoint(out)` reads its latest params.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from hat_jax.cache import atomic_dir
from hat_jax.data.packing import PackedBatches, refuse_packed_state
from hat_jax.data.pipeline import SFTDataConfig, sft_batches, sft_dataset
from hat_jax.data.world_data import WorldDataConfig, cache_root, sft_env_config, sft_records
from hat_jax.model.config import get_config
from hat_jax.model.params import COMPUTE_DTYPES
from hat_jax.model.sharding import default_mesh
from hat_jax.model.transformer import Qwen3_5MoeForCausalLM
from hat_jax.rollout.checkpoint import tokenizer_from_checkpoint
from hat_jax.train.losses import (COUNTED_BLOCK_ROWS, masked_token_ce_sum, masked_token_ce_sum_chunked,
                                  masked_token_ce_sum_counted_rows)
from hat_jax.train.mtp import DEFAULT_MTP_COEF, check_mtp_coef, check_mtp_model, mtp_aux
from hat_jax.train.optim import OptimConfig, lr_schedule, make_optimizer
from hat_jax.train.stage import (StageRun, copy_tokenizer, add_out_steps, add_resume_force, add_set_progress,
                                 apply_overrides, check_dtypes, check_model_options, check_model_overrides,
                                 check_run_fields, cli, config_json,
                                 finish_main, model_options, parse_stage_args, resolved_optim, run_options,
                                 stage_parser, stage_section)
from hat_jax.train.trainer import (LoopConfig, TrainState, make_train_step, moe_aux, output_router_stats, place_batch,
                                   process_rows, real_tokens, split_micro_batches)

log = logging.getLogger(__name__)
TOKENIZER_VERSION = 1
DEVICE_KEYS = ("input_ids", "attention_mask", "loss_mask")
PACKED_DEVICE_KEYS = ("input_ids", "segment_ids", "loss_mask")


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    """One SFT stage (the config *is* the experiment; its hash is checked on resume).

    Attributes:
      preset: model preset (`hat_jax.model.get_config`); model_overrides: ((field, value), ...) on top.
      world: the world's datasets (SFT records). data: the Grain pipeline; data.batch_size is the global
        batch per optimizer step, data.seq_len the row length, data.p_hsa the HSA switch (module docstring).
      optim: AdamW + schedule. steps: optimizer steps. accum_steps: micro-batches per step
        (data.batch_size / accum_steps rows each).
      lb_coef: MoE load-balancing coefficient. mtp_coef: weight of the MTP loss (`hat_jax.train.mtp`; >= 0,
        0 skips the MTP forward; default 0.1, DeepSeek-V3's lambda). compute_dtype: "float32" or "bfloat16".
      param_dtype: "float32" | "bfloat16", the trained params (and the second Adam moment). mu_dtype: the first
        Adam moment's dtype (None: param_dtype). remat_policy: how each decoder layer is
        rematerialised in the backward pass (`hat_jax.model.transformer.REMAT_POLICIES`; "none", "full", ...).
        scan_layers: scan over the repeating layer block (compile time flat in depth; same results).
        attention_impl: `hat_jax.model.attention.ATTENTION_IMPLS` ("auto": splash on TPU, cuDNN on GPU, XLA on
        CPU); moe_impl: the expert dispatch (`hat_jax.model.moe.MOE_IMPLS`; "ep_megablox" on TPU, "ep_ragged_dot" on GPU). Both
        compute the same math: like the mesh, they are not part of the config hash. moe_token_chunk: None, or
        the MoE dispatch run on chunks of this many tokens per device in a rematerialised scan (MoE buffers
        smaller by the number of chunks, same results; not hashed either; `hat_jax.model.moe.routed_experts`).
        vocab_chunk: None = full [B, T, V] logits; else the cross-entropy over vocabulary chunks of this size.
      log_every, ckpt_every, max_to_keep: metrics/checkpoint intervals and checkpoints kept.
      seed: init and step RNG. init: checkpoint to start from (None = fresh init).
      tokenizer_texts: pretraining chats in the BPE's training texts (when no tokenizer comes with init).
      tokenizer_split: the BPE's pre-tokenizer split (`hat_jax.tokenizer.SPLIT_PATTERNS`), with tokenizer_texts.
      mesh: (data, fsdp, expert, tensor[, context]) or None (fsdp x expert over every device when there are several);
        not part of the config hash, so a run resumes on another mesh.
      tie_lm_head: train the lm_head as the embedding's transpose (`hat_jax.train.trainer.make_train_step`), from
        a base whose two arrays are equal (one trained with `PretrainConfig.tie_lm_head`); the checkpoint keeps
        both, equal, in the architecture's untied layout. Untied, AdamW moves the output column of every token,
        and those of tokens the SFT records never contain drift from their embeddings (docs/tuning.md). Left
        out of the config's JSON and hash while False.
    """

    OMITTED_AT_DEFAULT: ClassVar[tuple[str, ...]] = ("tie_lm_head",)

    preset: str = "micro"
    model_overrides: tuple[tuple[str, Any], ...] = ()
    world: WorldDataConfig = WorldDataConfig()
    data: SFTDataConfig = SFTDataConfig(num_epochs=None)
    optim: OptimConfig = OptimConfig()
    steps: int = 100
    accum_steps: int = 1
    lb_coef: float = 0.001
    mtp_coef: float = DEFAULT_MTP_COEF
    compute_dtype: str = "float32"
    param_dtype: str = "float32"
    mu_dtype: str | None = None
    remat_policy: str = "none"
    scan_layers: bool = False
    attention_impl: str = "auto"
    moe_impl: str = "blocked"
    moe_token_chunk: int | None = None
    vocab_chunk: int | None = None
    log_every: int = 10
    ckpt_every: int = 50
    max_to_keep: int = 3
    seed: int = 0
    init: str | None = None
    tokenizer_texts: int = 200
    tokenizer_split: str = "qwen"
    mesh: tuple[int, ...] | None = None
    tie_lm_head: bool = False

    def __post_init__(self):
        check_run_fields(self)
        check_tokenizer_split("SFTConfig", self.tokenizer_split)
        check_dtypes("SFTConfig", compute_dtype=self.compute_dtype, param_dtype=self.param_dtype,
                     mu_dtype=self.mu_dtype)
        check_model_options("SFTConfig", self)
        check_model_overrides("SFTConfig", self)
        check_mtp_coef("SFTConfig", self.mtp_coef)
        if self.vocab_chunk is not None and self.vocab_chunk < 1:
            raise ValueError(f"SFTConfig.vocab_chunk = {self.vocab_chunk}: expected >= 1 or None")
        if self.accum_steps < 1 or self.data.batch_size % self.accum_steps:
            raise ValueError(f"SFTConfig: data.batch_size ({self.data.batch_size}) must be a multiple of "
                             f"accum_steps ({self.accum_steps}) >= 1")
        if self.steps < 1:
            raise ValueError(f"SFTConfig.steps = {self.steps}: expected >= 1")

    @property
    def harness_mode(self) -> str:
        """'original' (p_hsa = 0) or 'hsa'."""
        return "hsa" if self.data.p_hsa > 0 else "original"

    def model_config(self):
        return get_config(self.preset, **dict(self.model_overrides))

    @property
    def updates(self) -> int:
        """Optimizer updates of the run: `steps` (the schedule's end when optim.total_steps is None)."""
        return self.steps

    def to_json(self) -> dict:
        return config_json(self)


def with_hsa(config: SFTConfig, on: bool) -> SFTConfig:
    """The stage switch: 'off' -> p_hsa 0 (original harness) and p_recovery 0 (recovery turns are written into
    HSA-rewritten records only); 'on' -> the config's p_hsa (0.5 if it had 0) and p_recovery."""
    if on:
        return dataclasses.replace(config, data=dataclasses.replace(config.data, p_hsa=config.data.p_hsa or 0.5))
    return dataclasses.replace(config, data=dataclasses.replace(config.data, p_hsa=0.0, p_recovery=0.0))


# ---------------------------------------------------------------------------------------------- tokenizer

def _render_record(record: dict) -> str:
    from hat_jax.data.corpus import render_chat
    from hat_jax.harness.render import render_messages
    from hat_jax.sim.world_harness import world_harness

    h = world_harness(record["harness_id"])
    return render_chat(render_messages(h, record["messages"]), h.openai_tools())


def check_tokenizer_split(owner: str, split: str) -> None:
    """Raises ValueError naming `<owner>.tokenizer_split` unless it is a key of `hat_jax.tokenizer.SPLIT_PATTERNS`."""
    from hat_jax.tokenizer import SPLIT_PATTERNS

    if split not in SPLIT_PATTERNS:
        raise ValueError(f"{owner}.tokenizer_split = {split!r}: expected one of {sorted(SPLIT_PATTERNS)}")


def bpe_tokenizer_dir(vocab_size: int, tokenizer_texts: int, world: WorldDataConfig,
                      records: Sequence[dict] | None = None, split: str = "qwen") -> Path:
    """The cached byte-level BPE of the tiny presets: `<cache root>/tokenizers/bpe-<hash>`, trained on a miss.

    One tokenizer per (vocab_size, tokenizer_texts, world): the SFT stage and the base pretraining
    (`hat_jax.train.pretrain`) both call this, so SFT from a pretrained base sees the same tokenizer.
    Training texts: `tokenizer_training_texts(tokenizer_texts, 0)` (one tokenizer for every seed) + the
    rendered SFT records of `world`, so the live-stream vocabulary is covered. Written to a temporary
    folder and renamed into place (a concurrent caller that loses the race drops its copy).

    Args:
        records: the world's SFT records when the caller has them (else read on a miss with `sft_records`).
        split: the pre-tokenizer split (`hat_jax.tokenizer.SPLIT_PATTERNS`; part of the key unless "qwen").
    Returns:
        the folder (holds tokenizer.json and the chat template).
    """
    from hat_jax.data.corpus import tokenizer_training_texts
    from hat_jax.tokenizer import train_bpe_tokenizer

    key = json.dumps({"v": TOKENIZER_VERSION, "vocab": vocab_size, "texts": tokenizer_texts,
                      "world": world.digest("sft"), **({"split": split} if split != "qwen" else {})}, sort_keys=True)
    source = cache_root() / "tokenizers" / f"bpe-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    if not (source / "tokenizer.json").is_file():
        if records is None:
            records, _ = sft_records(world)
        texts = tokenizer_training_texts(tokenizer_texts, 0, [_render_record(r) for r in records])
        with atomic_dir(source) as tmp:  # another process may cache it first: then its folder is kept
            train_bpe_tokenizer(texts, vocab_size, tmp, split=split)
    return source


def sft_tokenizer(config: SFTConfig, records: Sequence[dict], out_dir: Path):
    """The stage's tokenizer, also saved to `<out_dir>/tokenizer` by process 0 (module docstring; the other
    processes of a multi-process run load it from where process 0 copies it from). Reuses that folder when it
    exists (a resumed run).

    Raises:
        ValueError: the tokenizer has more tokens than the model's vocab_size.
    """
    from hat_jax.tokenizer import load_tokenizer

    vocab = config.model_config().vocab_size
    target = out_dir / "tokenizer"
    source = target if (target / "tokenizer.json").is_file() else tokenizer_from_checkpoint(config.init)
    if source is None:
        source = bpe_tokenizer_dir(vocab, config.tokenizer_texts, config.world, records, config.tokenizer_split)
    source = copy_tokenizer(source, target)
    tok = load_tokenizer(source)
    if len(tok) > vocab:
        raise ValueError(f"tokenizer {str(source)!r} has {len(tok)} tokens, more than the model's vocab_size {vocab}")
    return tok


# ---------------------------------------------------------------------------------------------- the stage

def sft_loss_fn(model: Qwen3_5MoeForCausalLM, vocab_chunk: int | None = None, mtp: bool = False,
                block_rows: int | None = COUNTED_BLOCK_ROWS):
    """loss_fn(params, micro_batch, rng) -> (CE sum over loss tokens, loss-token count, moe_aux).

    A micro-batch with "segment_ids" holds packed rows (`PACKED_DEVICE_KEYS`): the model runs with the
    segment ids (attention, the DeltaNet state and conv, RoPE restart at each document), the CE counts only
    targets inside a document (`masked_token_ce_sum` with segment_ids) and the MoE auxiliaries exclude
    padding (segment id 0). Otherwise it holds one document per row (`DEVICE_KEYS`, attention_mask). With
    `vocab_chunk` the CE is computed from the final hidden states over vocabulary chunks (no [B, T, V] logits);
    without it and with `block_rows`, from the final hidden states on the blocks of `block_rows` positions that
    predict a loss token only (`masked_token_ce_sum_counted_rows`: most of an SFT row is prompt and tool results);
    `block_rows=None` takes the forward's own [B, T, V] logits (as XLA's cost model counts every position).
    With `mtp` the forward also runs the MTP block and aux gets its `mtp_loss` on the same loss tokens
    (`hat_jax.train.mtp.mtp_aux`, with the same `block_rows`); without it the MTP block is not run.
    """
    top_k = model.config.num_experts_per_tok
    full_logits = vocab_chunk is None and block_rows is None

    def loss_fn(params, micro, rng):
        del rng  # no dropout
        ids = micro["input_ids"]
        segment_ids = micro.get("segment_ids")
        opts = {"return_logits": full_logits, **({"with_mtp": True} if mtp else {})}
        if segment_ids is not None:
            out = model.apply({"params": params}, ids, segment_ids=segment_ids, **opts)
            token_mask = segment_ids > 0
        else:
            out = model.apply({"params": params}, ids, attention_mask=micro["attention_mask"], **opts)
            token_mask = micro["attention_mask"]
        if full_logits:
            ce, n = masked_token_ce_sum(out.logits, ids, micro["loss_mask"], segment_ids)
        elif vocab_chunk is None:
            ce, n = masked_token_ce_sum_counted_rows(out.hidden, params["lm_head"]["kernel"], ids, micro["loss_mask"],
                                                     segment_ids, block_rows, model.dtype)
        else:
            ce, n = masked_token_ce_sum_chunked(out.hidden, params["lm_head"]["kernel"], ids, micro["loss_mask"],
                                                vocab_chunk, model.dtype, segment_ids)
        aux = moe_aux(output_router_stats(out, token_mask, top_k))
        if mtp:
            aux.update(mtp_aux(out, params, ids, micro["loss_mask"], token_mask, top_k, segment_ids=segment_ids,
                               vocab_chunk=vocab_chunk, block_rows=block_rows, compute_dtype=model.dtype))
        return ce, n, aux

    return loss_fn


def load_init_params(path: str | Path, model_config, what: str = "SFT init", mesh=None, dtype=None):
    """Params of the checkpoint `path` (a model checkpoint or a stage's run dir), checked against the stage's
    `model_config`, read straight into `mesh`'s shardings (`hat_jax.train.sharded_init.restore_params`) and,
    with `dtype` ("float32" / "bfloat16"), cast to it inside `jit` on those shardings. Shared by the stages
    (RL init/reference).

    Args:
        path: checkpoint directory. model_config: the architecture the stage expects.
        what: how the messages name the checkpoint (e.g. "SFT init", "RL reference").
        mesh: the stage's mesh or None (the default device). dtype: None keeps the stored dtypes.
    Raises:
        FileNotFoundError: `path` does not exist.
        IncompatibleCheckpointError: unreadable params, another shape (names the first bad leaf), another model
            config (lists the differing fields), a mesh that cannot shard a parameter (names it).
    """
    from hat_jax.model.params import cast_params
    from hat_jax.train.sharded_init import restore_params

    params = restore_params(path, model_config, mesh, what)
    return params if dtype is None else cast_params(params, model_config, COMPUTE_DTYPES[dtype], mesh)


def _initial_params(config: SFTConfig, model_config, mesh=None):
    from hat_jax.train.sharded_init import fresh_params

    if config.init is None:
        return fresh_params(model_config, config.seed, mesh)
    return load_init_params(config.init, model_config, "SFT init", mesh)


def _check_tied_init(config: SFTConfig, params: dict) -> None:
    """Raises ValueError unless the init's lm_head kernel [H, V] equals its embedding [V, H] transposed: tied
    training replaces the lm_head by that transpose, so an init trained apart would lose its lm_head."""
    embedding, kernel = params["model"]["embed_tokens"]["embedding"], params["lm_head"]["kernel"]
    if config.init is None:
        raise ValueError("SFTConfig.tie_lm_head = True needs init: a base trained with PretrainConfig.tie_lm_head "
                         "(a fresh init draws the lm_head apart from the embedding)")
    if not bool(jnp.array_equal(kernel, embedding.T)):
        raise ValueError(f"SFTConfig.tie_lm_head = True needs an init whose lm_head equals the embedding's "
                         f"transpose (a base trained with PretrainConfig.tie_lm_head); init {config.init!r} has them "
                         f"apart, and tying would discard its lm_head")


def run_sft(config: SFTConfig, out_dir: str | Path, *, resume: bool = False, force: bool = False,
            progress: bool = True) -> TrainState:
    """Runs the SFT stage into `out_dir` (module docstring); returns the final state.

    Args:
        resume: continue from the latest checkpoint in out_dir (fresh start when there is none).
        force: resume despite a stage-config hash mismatch.
    Raises:
        FileExistsError: out_dir already holds checkpoints and resume is False.
        ckpt.ConfigMismatchError / IncompatibleCheckpointError: see `hat_jax.train.checkpoints`.
        NonFiniteLossError: a NaN/inf loss (the last good checkpoint stays on disk).
        ValueError: tie_lm_head with an init whose lm_head is not the embedding's transpose.
    """
    run = StageRun("sft", out_dir, config.to_json(), resume=resume, force=force, logger=log)
    out = run.out
    out.mkdir(parents=True, exist_ok=True)
    model_config = config.model_config()
    check_mtp_model("SFTConfig", config.mtp_coef, model_config)

    mesh = default_mesh(config.mesh, model_config.num_experts)
    params = _initial_params(config, model_config, mesh) if run.existing is None else None  # fail fast on a bad --init
    if params is not None and config.tie_lm_head:
        _check_tied_init(config, params)
    records, _ = sft_records(config.world)
    tokenizer = sft_tokenizer(config, records, out)
    from hat_jax.sim.world_harness import world_harness

    rows = host_rows(mesh, config.data.batch_size, config.accum_steps)
    harness = config.world.harness
    dataset = sft_dataset(records, {harness: world_harness(harness)}, tokenizer, config.data, rows=rows,
                          env_config=sft_env_config(config.world))
    batches = sft_batches(dataset, config.data)

    def hsa_share(host):
        if "documents" in host:  # packed rows: counts of the rows' trajectories
            docs = int(np.sum(host["documents"]))
            return {"data/hsa_share": float(np.sum(host["hsa_any"])) / max(docs, 1), "data/documents": float(docs)}
        return {"data/hsa_share": float(np.mean(np.any(host["hsa_applied"] != 0, axis=1)))}

    return run_masked_ce(run, config, model_config, params, batches, desc=f"sft[{config.harness_mode}]",
                         mesh_shape=config.mesh, progress=progress, batch_metrics=hsa_share,
                         param_dtype=config.param_dtype, mu_dtype=config.mu_dtype,
                         vocab_chunk=config.vocab_chunk, tie_lm_head=config.tie_lm_head,
                         global_batch=None if rows is None else config.data.batch_size)


def host_rows(mesh, batch_size: int, accum_steps: int):
    """This process's rows of each global batch (`hat_jax.train.trainer.process_rows`) in a multi-process run,
    None in a single-process one (the pipeline then yields whole batches)."""
    if mesh is None or jax.process_count() == 1:
        return None
    return process_rows(mesh, accum_steps, batch_size // accum_steps)


def run_masked_ce(run: StageRun, config, model_config, params, batches, *, desc: str, mesh_shape=None,
                  progress: bool = True, batch_metrics=None, param_dtype: str = "float32", mu_dtype: str | None = None,
                  vocab_chunk: int | None = None, global_batch: int | None = None,
                  tie_lm_head: bool = False) -> TrainState:
    """The masked token-CE training loop shared by SFT and the base pretraining (`hat_jax.train.pretrain`): the
    state from `run.start` (restored with the iterator's data state on resume), `sft_loss_fn` + lb_coef x the MoE
    load-balancing loss, `accum_steps` micro-batches of `DEVICE_KEYS`, `run.run` with the config's intervals.

    Args:
      run: the stage's `StageRun`. config: a stage config with optim, lb_coef, mtp_coef, compute_dtype, accum_steps,
        steps, log_every, ckpt_every, max_to_keep and seed. model_config: the architecture. params: the initial params
        (None when resuming). batches: an iterator with get_state / set_state yielding host batches with
        `DEVICE_KEYS`, or packed ones with `PACKED_DEVICE_KEYS` (`hat_jax.data.packing.PackedBatches`).
        desc: progress label. mesh_shape: `default_mesh`'s shape. batch_metrics: as `run_stage`; the step's
          data/slot_fill (real tokens / row slots of its batch) is logged with them.
      param_dtype, mu_dtype, vocab_chunk: as `SFTConfig`; the model options (`model_options`) come from config.
      global_batch: the host batches hold only this process's rows (`host_rows`) of global batches of this many
        rows; None: whole batches, of which each process places its rows (`place_batch`).
      tie_lm_head: train the lm_head tied to the embedding (`make_train_step`; the base's
        `PretrainConfig.tie_lm_head`).
    Returns:
      the final TrainState.
    Raises:
      DataStateFormatError: the checkpoint's data state was written by the other layout (packed / unpacked).
    """
    optim = resolved_optim(config)
    optimizer = make_optimizer(optim, mu_dtype=COMPUTE_DTYPES[mu_dtype] if mu_dtype else None)
    mesh = default_mesh(mesh_shape, model_config.num_experts)
    state, data_state = run.start(model_config, optimizer, mesh, params, config.seed, param_dtype)
    if data_state is not None:
        if not isinstance(batches, PackedBatches):  # a packed checkpoint cannot resume an unpacked pipeline
            refuse_packed_state(data_state, desc)
        batches.set_state(data_state)  # PackedBatches refuses an unpacked pipeline's state (DataStateFormatError)
    model = Qwen3_5MoeForCausalLM(model_config, dtype=COMPUTE_DTYPES[config.compute_dtype],
                                  **model_options(config))
    check_mtp_model(type(config).__name__, config.mtp_coef, model_config)
    step_fn = make_train_step(sft_loss_fn(model, vocab_chunk, mtp=config.mtp_coef > 0), optimizer,
                              lb_coef=config.lb_coef, mtp_coef=config.mtp_coef, schedule=lr_schedule(optim),
                              shardings=run.shardings, tie_lm_head=tie_lm_head)

    def prepare(host):
        keys = PACKED_DEVICE_KEYS if "segment_ids" in host else DEVICE_KEYS
        return place_batch(split_micro_batches(host, config.accum_steps, keys), mesh, global_rows=global_rows)

    global_rows = None if global_batch is None else global_batch // config.accum_steps

    def step_metrics(host):
        out = {"data/slot_fill": real_tokens(host) / float(np.size(host["input_ids"]))}
        return {**out, **batch_metrics(host)} if batch_metrics is not None else out

    loop = LoopConfig(config.steps, config.log_every, config.ckpt_every, desc=desc, progress=progress)
    return run.run(loop, state, batches, step_fn, max_to_keep=config.max_to_keep, prepare=prepare,
                   data_state=batches.get_state, batch_metrics=step_metrics)


def main(argv: Sequence[str] | None = None) -> int:
    parser = stage_parser("sft", __doc__)
    add_out_steps(parser)
    add_resume_force(parser)
    parser.add_argument("--init", help="checkpoint to start from (model checkpoint or a stage's run dir)")
    parser.add_argument("--hsa", choices=("on", "off"), help="harness perturbation: on (HSA) or off (original)")
    add_set_progress(parser, "data.seq_len=3072, optim.lr=1e-3, model.vocab_size=1024")
    args = parse_stage_args(parser, argv)
    config = stage_section(args.preset, "sft")
    if args.steps is not None:
        config = dataclasses.replace(config, steps=args.steps)
    if args.hsa is not None:
        config = with_hsa(config, args.hsa == "on")
    if args.init is not None:
        config = dataclasses.replace(config, init=str(Path(args.init).resolve()))
    config = apply_overrides(config, args.set)
    return finish_main(args, run_sft(config, args.out, **run_options(args)))


if __name__ == "__main__":
    cli(main, compile_cache=True)
