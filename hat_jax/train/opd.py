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

This module is the stage (`run_opd`, the CLI): checkpoints, tokenizer, the update (`make_train_step` over the
loss, micro-batched by accum_steps; for "exact" the teacher's lm_head kernel goes with every micro-batch). Its
config is `hat_jax.train.opd_config.OPDConfig`, one step's batch (prompts or live-stream episodes sampled with
the current student, plus the teacher's logprobs) `hat_jax.train.opd_batches`, the loss and the teacher's
forward `hat_jax.train.opd_loss`.

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

from hat_jax.model.params import COMPUTE_DTYPES
from hat_jax.model.sharding import default_mesh
from hat_jax.model.transformer import Qwen3_5MoeForCausalLM
from hat_jax.rollout.checkpoint import tokenizer_from_checkpoint
from hat_jax.train import checkpoints as ckpt
from hat_jax.train.kl import OPD_LOSSES
from hat_jax.train.mtp import check_mtp_model
from hat_jax.train.opd_batches import EXACT_KEYS, SAMPLED_KEYS, OPDBatches, live_pool, prompt_pool
from hat_jax.train.opd_config import OPDConfig
from hat_jax.train.opd_loss import opd_loss_fn
from hat_jax.train.rl_loss import PACKED_KEYS
from hat_jax.train.rl_rewards import SHOWN
from hat_jax.train.optim import lr_schedule, make_optimizer
from hat_jax.train.stage import (StageRun, copy_tokenizer, add_out_steps, add_resume_force, add_set_progress,
                                 apply_overrides, cli, finish_main, model_options, parse_stage_args, resolved_optim,
                                 run_options, stage_parser, stage_section)
from hat_jax.train.trainer import (LoopConfig, TrainState, batch_ways, make_train_step, place_batch,
                                   split_micro_batches)

log = logging.getLogger(__name__)
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
    batches = OPDBatches(config, model_config, tokenizer, pool, teacher_params, teacher_model,
                         batch_ways=batch_ways(mesh))
    teacher_kernel = teacher_params["lm_head"]["kernel"]
    keys = (*(EXACT_KEYS if config.loss == "exact" else SAMPLED_KEYS), *PACKED_KEYS)

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
    loop = LoopConfig(config.steps, config.log_every, config.ckpt_every, desc=desc, progress=progress,
                      shown=SHOWN if config.prompts == "live" else ())
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
    cli(main, compile_cache=True)
