"""The on-policy distillation (OPD) stage: the student samples answers to general-domain prompts ("general",
"tulu") or whole multi-turn episodes in the live-stream environment ("live") and is pulled toward a frozen
teacher by the per-token reverse KL along its own samples.

Run (the HAT chain passes the SFT run as --init and the pre-SFT base as --teacher; Table 5's distillation arm
passes the HSA-SFT(+OPD) run as --init and a stronger model with the same tokenizer as --teacher):

    python -m hat_jax.train.opd --preset micro|tiny --init CKPT [--teacher CKPT] --out DIR [--steps N]
        [--loss sampled|exact] [--resume [--force]] [--set prompts_per_step=8 --set optim.lr=1e-4 ...]
    python -m hat_jax.train.opd --preset micro|tiny --live --init CKPT --teacher CKPT --out DIR
        [--set harness_mode=hsa ...]        (the scale's opd_live section: live-stream episodes)

Objective (the HAT report, arXiv 2608.15763 (TaoLive, 2026), "Training, three stages",
stage 2): GKD with lambda = 1 and the reverse-KL end (Agarwal et al. 2024, arXiv 2306.13649),
KL_t = KL(pi_s(.|c_t) || pi_T(.|c_t)) on the student's sampled completions, by the "sampled" (Thinking
Machines' OPD, K. Lu 2025) or the "exact" (NeMo-RL's "full") estimator of `hat_jax.train.kl`.

The stage is three modules:
- this one: `OPDConfig` and the stage (`run_opd`, the CLI): checkpoints, tokenizer, the update
  (`make_train_step` over the loss, micro-batched by accum_steps; for "exact" the teacher's lm_head kernel
  goes with every micro-batch).
- `hat_jax.train.opd_batches`: one step's batch (`OPDBatches`): prompts or, for "live", the RL stage's
  live-stream episodes (Table 5 of the HAT report), sampled with the current student, plus the teacher's
  logprobs.
- `hat_jax.train.opd_loss`: the loss function (both estimators, their biases, the aggregation under gradient
  accumulation) and the teacher's forward.

Logged: the OPD loss, k1/k3/exact reverse KL, policy and rollout statistics, and for "live" the RL stage's
reward and rollout tags (docs/metrics.md, "OPD").

Models and tokenizer: the student's architecture is the --init checkpoint's (model_config.json), the
teacher's its own; the two must share the vocabulary (same vocab_size, and the same tokens when the teacher
has a tokenizer folder; the teacher may be larger). The tokenizer is the init's `tokenizer/` folder (required:
prompts are rendered with its chat template), copied to `<out>/tokenizer`. `--out` is the checkpoint root and
TensorBoard run directory; `--resume` continues a killed run bit-exactly (params, optimizer, rng, step; prompts
and samples are functions of (seed, step) and the restored params; so are "live" tasks, harnesses and episodes).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp

from hat_jax.data.world_data import WorldDataConfig
from hat_jax.harness.hsa import HSAConfig
from hat_jax.judges.rewards import RewardConfig
from hat_jax.model.params import COMPUTE_DTYPES
from hat_jax.model.sharding import default_mesh
from hat_jax.model.transformer import Qwen3_5MoeForCausalLM
from hat_jax.rollout.checkpoint import tokenizer_from_checkpoint
from hat_jax.sim.env import EnvConfig
from hat_jax.train import checkpoints as ckpt
from hat_jax.train.kl import OPD_LOSSES, check_opd_loss
from hat_jax.train.losses import check_aggregation
from hat_jax.train.mtp import DEFAULT_MTP_COEF, check_mtp_coef, check_mtp_model
from hat_jax.train.opd_batches import EXACT_KEYS, SAMPLED_KEYS, OPDBatches, live_pool, prompt_pool
from hat_jax.train.opd_loss import opd_loss_fn
from hat_jax.train.optim import OptimConfig, lr_schedule, make_optimizer
from hat_jax.train.rl import HARNESS_MODES, rl_fault_rates
from hat_jax.train.stage import (StageRun, copy_tokenizer, add_out_steps, add_resume_force, add_set_progress,
                                 apply_overrides, check_dtypes, check_model_options, check_run_fields, cli, config_json,
                                 finish_main, model_options, parse_stage_args, resolved_optim, run_options,
                                 stage_parser, stage_section)
from hat_jax.train.trainer import LoopConfig, TrainState, make_train_step, place_batch, split_micro_batches

log = logging.getLogger(__name__)
PROMPT_SOURCES = ("general", "tulu", "live")


@dataclasses.dataclass(frozen=True)
class OPDConfig:
    """One OPD stage (the config is the experiment; its hash is checked on resume).

    Attributes:
      preset: a label of the scale section the stage came from (the model is the init checkpoint's).
      init: student checkpoint (a model checkpoint or a stage's run dir); required.
      teacher: frozen teacher checkpoint; None = the student's init. In the HAT chain the teacher is the
        pre-SFT base, passed explicitly (--teacher), while --init is the SFT run.
      loss: "sampled" | "exact" (`OPD_LOSSES`, `hat_jax.train.opd_loss`).
      prompts: "general" (IFEval-style train split) | "tulu" (`tulu_path`, a local Tulu-3 copy) | "live"
        (multi-turn episodes in the live-stream environment, `hat_jax.train.opd_batches`).
      prompt_pool: prompts drawn into the pool ("general"/"tulu"). prompts_per_step, samples_per_prompt:
        B = their product ("live": tasks per step and episodes per task).
      temperature, top_p: sampling (logprobs use the same temperature). max_new_tokens: completion budget
        ("live": per model turn). seq_len: the cap on a row's tokens (prompt + completion, or a whole episode).
      bucket: prompt-length bucket of the sampler (compilations). rollout_wave_rows: rows per decode call of
        the sampler (as `hat_jax.train.rl.RLConfig`), None = all at once. train_bucket: None = rows padded to seq_len
        (one shape); else to a multiple of it, at most seq_len. enable_thinking: chat-template switch
        ("general"/"tulu"; must be True for "live").
      harness_mode, hsa, world, env, max_turns, reward ("live" only, as `hat_jax.train.rl.RLConfig`):
        "original" | "hsa" harnesses and the `compose` settings; the RL tasks' world; episode limits and
        tool faults; model turns per episode; the CoT-penalty shape and weights of the logged judge rewards.
      clip_eps: PPO clip of the sampled loss (None = no clip). kl_coef: scale of the KL (advantage or loss).
      aggregation: `hat_jax.train.losses.AGGREGATIONS`. vocab_chunk: None = full logits; else the
        vocabulary chunk of the chunked logprob/KL/entropy computations.
      mtp_coef: weight of the MTP loss on the student's sampled tokens (`hat_jax.train.mtp`; >= 0, 0 skips the
        MTP forward; default 0.1, DeepSeek-V3's lambda).
      optim, accum_steps, lb_coef, compute_dtype, param_dtype, mu_dtype, remat_policy, scan_layers, attention_impl, moe_impl, moe_token_chunk, steps, log_every, ckpt_every,
        max_to_keep, seed, mesh: as SFT. The frozen teacher is held in compute_dtype.
    """

    preset: str = "micro"
    init: str | None = None
    teacher: str | None = None
    loss: str = "sampled"
    prompts: str = "general"
    prompt_pool: int = 256
    tulu_path: str | None = None
    prompts_per_step: int = 4
    samples_per_prompt: int = 2
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 32
    seq_len: int = 256
    bucket: int = 64
    rollout_wave_rows: int | None = None
    train_bucket: int | None = None
    enable_thinking: bool = True
    harness_mode: str = "original"
    hsa: HSAConfig = HSAConfig()
    world: WorldDataConfig = WorldDataConfig(sft_tasks=0, eval_items=0)
    env: EnvConfig = EnvConfig(fault_rates=rl_fault_rates())
    max_turns: int = 8
    reward: RewardConfig = RewardConfig()
    clip_eps: float | None = None
    kl_coef: float = 1.0
    aggregation: str = "token-mean"
    vocab_chunk: int | None = None
    optim: OptimConfig = OptimConfig()
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
    steps: int = 100
    log_every: int = 10
    ckpt_every: int = 50
    max_to_keep: int = 3
    seed: int = 0
    mesh: tuple[int, ...] | None = None

    def __post_init__(self):
        check_run_fields(self)
        check_dtypes("OPDConfig", param_dtype=self.param_dtype, mu_dtype=self.mu_dtype)
        check_model_options("OPDConfig", self)
        check_mtp_coef("OPDConfig", self.mtp_coef)
        check_opd_loss(self.loss)
        check_aggregation(self.aggregation)
        if self.prompts not in PROMPT_SOURCES:
            raise ValueError(f"OPDConfig.prompts = {self.prompts!r}; valid: {', '.join(PROMPT_SOURCES)}")
        if self.harness_mode not in HARNESS_MODES:
            raise ValueError(f"OPDConfig.harness_mode = {self.harness_mode!r}; valid: {', '.join(HARNESS_MODES)}")
        if self.prompts == "live" and not self.enable_thinking:
            raise ValueError("OPDConfig.enable_thinking = False is not supported with prompts = 'live' (the harness "
                             "renders the episode's prompt, with thinking on)")
        if self.prompts == "tulu" and not self.tulu_path:
            raise ValueError("OPDConfig.prompts = 'tulu' needs tulu_path (a local Tulu-3 parquet/jsonl copy)")
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"OPDConfig.compute_dtype = {self.compute_dtype!r}; valid: {sorted(COMPUTE_DTYPES)}")
        if not self.temperature > 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"OPDConfig: temperature ({self.temperature}) > 0 and top_p ({self.top_p}) in (0, 1] "
                             "required (OPD samples; greedy decoding has no logprobs to distil)")
        for name in ("prompt_pool", "prompts_per_step", "samples_per_prompt", "max_new_tokens", "bucket", "steps",
                     "max_turns"):
            if getattr(self, name) < 1:
                raise ValueError(f"OPDConfig.{name} = {getattr(self, name)}: expected >= 1")
        if self.seq_len <= self.max_new_tokens:
            raise ValueError(f"OPDConfig: seq_len ({self.seq_len}) must exceed max_new_tokens ({self.max_new_tokens})")
        rows = self.prompts_per_step * self.samples_per_prompt
        if self.accum_steps < 1 or rows % self.accum_steps:
            raise ValueError(f"OPDConfig: prompts_per_step * samples_per_prompt ({rows}) must be a multiple of "
                             f"accum_steps ({self.accum_steps}) >= 1")
        if self.clip_eps is not None and not self.clip_eps > 0:
            raise ValueError(f"OPDConfig.clip_eps = {self.clip_eps}: expected > 0 or None")
        for name in ("vocab_chunk", "train_bucket"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"OPDConfig.{name} = {getattr(self, name)}: expected >= 1 or None")

    @property
    def rows(self) -> int:
        return self.prompts_per_step * self.samples_per_prompt

    @property
    def max_len(self) -> int:
        """L_max of "seq-mean-token-sum-norm": the sampling budget of a row."""
        if self.prompts == "live":
            return min(self.max_turns * self.max_new_tokens, self.seq_len)
        return self.max_new_tokens

    @property
    def updates(self) -> int:
        """Optimizer updates of the run: `steps` (the schedule's end when optim.total_steps is None)."""
        return self.steps

    def to_json(self) -> dict:
        return config_json(self)


def apply_opd_overrides(config: OPDConfig, assignments: Sequence[str]) -> OPDConfig:
    """`key.path=value` assignments (`hat_jax.train.stage.apply_overrides`); the model is the init's, so
    `model.*` keys are refused."""
    return apply_overrides(config, assignments, no_model="--set {item!r}: the OPD student's architecture is its "
                                                         "--init checkpoint's; model fields cannot be overridden")


def _checkpoint_config(path: str, role: str):
    from hat_jax.model.checkpoint_io import resolve_checkpoint
    from hat_jax.model.hf_io import read_hf_config

    if not Path(path).exists():
        raise FileNotFoundError(f"OPD {role} checkpoint {path!r} does not exist")
    try:
        return read_hf_config(resolve_checkpoint(path)[1])
    except ValueError as err:
        raise ckpt.IncompatibleCheckpointError(f"OPD {role} checkpoint {path!r}: {err}") from err


def load_checkpoint(path: str, role: str, mesh_shape=None, dtype: str | None = None):
    """(model config, params) of a model checkpoint or run dir, read straight into the shardings of
    `default_mesh(mesh_shape)` for its model and, with `dtype`, cast to it inside `jit` on them (the stored
    dtypes otherwise); errors name the role and path.

    Raises:
      FileNotFoundError: missing checkpoint or params. IncompatibleCheckpointError: unreadable or mismatched, or
        a mesh that cannot shard a parameter (named).
    """
    from hat_jax.model.params import cast_params
    from hat_jax.train.sharded_init import restore_params

    model_config = _checkpoint_config(path, role)
    mesh = default_mesh(mesh_shape, model_config.num_experts)
    try:
        params = restore_params(path, model_config, mesh, f"OPD {role}")
    except FileNotFoundError as err:
        raise FileNotFoundError(f"OPD {role} checkpoint {path!r}: {err}") from err
    if dtype is not None:
        params = cast_params(params, model_config, COMPUTE_DTYPES[dtype], mesh)
    return model_config, params


def opd_tokenizer(config: OPDConfig, vocab_size: int, out_dir: Path):
    """The student's tokenizer (from `<out>/tokenizer` on resume, else the init's), copied to `<out>/tokenizer`;
    the teacher's tokenizer folder, when it has one, must hold the same tokens.

    Raises:
      FileNotFoundError: the init has no tokenizer folder.
      IncompatibleCheckpointError: the tokenizer does not fit the vocabulary, or the teacher's differs.
    """
    from hat_jax.tokenizer import load_tokenizer

    target = out_dir / "tokenizer"
    source = target if (target / "tokenizer.json").is_file() else tokenizer_from_checkpoint(config.init)
    if source is None:
        raise FileNotFoundError(f"OPD student init checkpoint {config.init!r} has no tokenizer/ folder (nor its "
                                "parent): OPD renders chat prompts with the student's tokenizer")
    source = copy_tokenizer(source, target)
    tok = load_tokenizer(source)
    if len(tok) > vocab_size:
        raise ckpt.IncompatibleCheckpointError(f"tokenizer {str(source)!r} has {len(tok)} tokens, more than the "
                                               f"student's vocab_size {vocab_size}")
    teacher_tok = tokenizer_from_checkpoint(config.teacher)
    if teacher_tok is not None and load_tokenizer(teacher_tok).get_vocab() != tok.get_vocab():
        raise ckpt.IncompatibleCheckpointError(f"OPD teacher checkpoint {config.teacher!r} has another tokenizer "
                                               f"({str(teacher_tok)!r}) than the student's ({str(source)!r}): "
                                               "the two must share one")
    return tok


def run_opd(config: OPDConfig, out_dir: str | Path, *, resume: bool = False, force: bool = False,
            progress: bool = True) -> TrainState:
    """Runs the OPD stage into `out_dir` (module docstring); returns the final state.

    Args:
      resume: continue from the latest checkpoint in out_dir. force: resume despite a config-hash mismatch.
    Raises:
      ValueError: no init. FileExistsError: out_dir holds checkpoints and resume is False.
      FileNotFoundError / IncompatibleCheckpointError: a bad init or teacher (named), a teacher with another
        vocabulary. ConfigMismatchError, NonFiniteLossError: see `hat_jax.train.checkpoints` / `trainer`.
    """
    if config.init is None:
        raise ValueError("OPDConfig.init: the student checkpoint is required (--init)")
    if config.teacher is None:
        config = dataclasses.replace(config, teacher=config.init)
    run = StageRun("opd", out_dir, config.to_json(), resume=resume, force=force, logger=log)
    out = run.out
    if run.existing is None:
        model_config, params = load_checkpoint(config.init, "student init", config.mesh)
    else:
        model_config, params = _checkpoint_config(config.init, "student init"), None
    check_mtp_model("OPDConfig", config.mtp_coef, model_config)
    teacher_config, teacher_params = load_checkpoint(config.teacher, "teacher", config.mesh, config.compute_dtype)
    if teacher_config.vocab_size != model_config.vocab_size:
        raise ckpt.IncompatibleCheckpointError(
            f"OPD teacher checkpoint {config.teacher!r} has vocab_size {teacher_config.vocab_size}, the student "
            f"{config.init!r} {model_config.vocab_size}: the two must share a tokenizer")
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = opd_tokenizer(config, model_config.vocab_size, out)
    pool = live_pool(config, tokenizer) if config.prompts == "live" else prompt_pool(config, tokenizer)

    optim = resolved_optim(config)
    optimizer = make_optimizer(optim, mu_dtype=COMPUTE_DTYPES[config.mu_dtype] if config.mu_dtype else None)
    mesh = default_mesh(config.mesh, model_config.num_experts)
    state, _ = run.start(model_config, optimizer, mesh, params, config.seed, config.param_dtype)
    dtype = COMPUTE_DTYPES[config.compute_dtype]
    model = Qwen3_5MoeForCausalLM(model_config, dtype=dtype, **model_options(config))
    teacher_model = Qwen3_5MoeForCausalLM(teacher_config, dtype=dtype, **model_options(config, train=False))
    train_step = make_train_step(opd_loss_fn(model, config), optimizer, lb_coef=config.lb_coef,
                                 mtp_coef=config.mtp_coef, schedule=lr_schedule(optim), shardings=run.shardings)
    batches = OPDBatches(config, model_config, tokenizer, pool, teacher_params, teacher_model)
    teacher_kernel = teacher_params["lm_head"]["kernel"]
    keys = EXACT_KEYS if config.loss == "exact" else SAMPLED_KEYS

    def prepare(host):
        dev = place_batch(split_micro_batches(host, config.accum_steps, keys), mesh)
        if config.loss == "exact":
            dev["teacher_kernel"] = jnp.broadcast_to(teacher_kernel, (config.accum_steps, *teacher_kernel.shape))
        return dev

    def step_fn(state, batch):
        t0 = time.perf_counter()
        state, metrics = train_step(state, batch)
        jax.block_until_ready(state)
        metrics["time/train_s"] = time.perf_counter() - t0
        return state, metrics

    desc = f"opd[{config.loss}]" if config.prompts != "live" else f"opd-live[{config.loss}, {config.harness_mode}]"
    loop = LoopConfig(config.steps, config.log_every, config.ckpt_every, desc=desc, progress=progress)
    return run.run(loop, state, batches, step_fn, max_to_keep=config.max_to_keep, prepare=prepare,
                   batch_metrics=lambda host: host["stats"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = stage_parser("opd", __doc__)
    parser.add_argument("--live", action="store_true",
                        help="the scale's live-stream section (opd_live: Table 5's distillation arm) instead of opd")
    parser.add_argument("--init", required=True, help="student checkpoint (model checkpoint or a stage's run dir)")
    parser.add_argument("--teacher", help="frozen teacher checkpoint (default: --init; in HAT: the pre-SFT base)")
    add_out_steps(parser)
    parser.add_argument("--loss", choices=OPD_LOSSES, help="reverse-KL loss: sampled-token estimator or exact")
    add_resume_force(parser)
    add_set_progress(parser, "prompts_per_step=8, optim.lr=1e-4, clip_eps=0.2, prompts=live, harness_mode=hsa")
    args = parse_stage_args(parser, argv)
    config = stage_section(args.preset, "opd_live" if args.live else "opd")
    if args.steps is not None:
        config = dataclasses.replace(config, steps=args.steps)
    changes = {"init": str(Path(args.init).resolve())}
    if args.teacher is not None:
        changes["teacher"] = str(Path(args.teacher).resolve())
    if args.loss is not None:
        changes["loss"] = args.loss
    config = apply_opd_overrides(dataclasses.replace(config, **changes), args.set)
    return finish_main(args, run_opd(config, args.out, **run_options(args)))


if __name__ == "__main__":
    cli(main)
