"""The HSA-RL stage: GRPO / GDPO / Dr.GRPO on decomposed judge rewards over multi-turn simulator rollouts.

Run (from a stage's run dir or a model checkpoint that has a `tokenizer/` folder next to it):

    python -m hat_jax.train.rl --preset micro|tiny --init CKPT --out DIR [--steps N] [--harness original|hsa]
        [--resume [--force]] [--set key.path=value ...]

One RL step (a batch function for `hat_jax.train.trainer.run_stage`, called with the current state):
1. Tasks: `tasks_per_step` distinct tasks of `rl_tasks(config.world)` drawn by numpy's generator seeded
   with (seed, step). Harness (the stage switch): "original" = the production harness;
   "hsa" = `compose(production, random.Random(s), config.hsa, "train")` per task, s derived from
   (seed, step, task index) (`numpy.random.SeedSequence`); the env runs and the judges score under it.
2. Rollouts: `hat_jax.rollout.rollout_episodes` with the *current* params (pi_old = the sampler),
   G = `group_size` episodes per task (same faults within a group), at most `max_turns` model turns of
   `max_new_tokens` each, `env.max_tool_rounds` tool rounds (paper: 4), sequences capped at `seq_len`; rng
   fold_in(fold_in(key(seed), 2), step). Everything a step draws depends on (seed, step) and the params
   only, so a resumed run repeats the killed one exactly; the checkpoint's data_state is just
   {"rl_step": n} (informational).
   Sampling: temperature (default 1.0) and top_p (default 1.0 = off). The sampler's logprobs are
   log_softmax(logits / T) *before* top-p truncation (`hat_jax.model.sampling`), and the trainer recomputes
   exactly that, so with top_p < 1 the tokens come from the truncated distribution while the ratio's
   denominator is the untruncated one: an off-policy mismatch (TRL #6789) that this stage does not
   correct (no TIS/MIS); keep top_p = 1 for on-policy RL.
3. Rewards (`hat_jax.judges`): `judge_episode(episode, harness)` and `reward_components` -> Accuracy,
   Effectiveness, Tool Rationality, Skill Selection and the CoT length penalty (0 up to `reward.cot_free`
   = 100 reasoning tokens, linear to -1 at `reward.cot_zero_at` = 200; mean over the episode's turns).
   Reasoning tokens are counted per sampled turn, a truncated last turn too
   (`hat_jax.rollout.turns.reasoning_tokens`).
4. Advantages (`hat_jax.train.advantages`; the HAT report, arXiv 2608.15763, "Training, three stages"):
   `estimator` "grpo", "gdpo" or "dr_grpo", each registered there with its normalisation, eps and source.
   Weights: `reward.weights` (components missing there weigh 0). A zero-variance or single-sample group gives 0.
   A NaN/inf component drops the sample: advantage 0 *and* action mask zeroed (it adds no token and no
   sequence to any normaliser), counted in data/invalid_samples.
5. Update (`hat_jax.train.rl_loss`): per token max(-A rho, -A clip(rho, 1 - eps_low, 1 + eps_high))
   + beta k3(logp, logp_ref) (DAPO clip-higher 0.2 / 0.28, arXiv 2503.14476; k3 in the loss as GRPO, only
   with beta > 0: the reference, default the init checkpoint, is then forwarded once per step), aggregated
   by `aggregation` ("token-mean" DAPO / verl default, "seq-mean-token-mean" GRPO, "seq-mean-token-sum-norm"
   Dr.GRPO with L_max = min(max_turns * max_new_tokens, seq_len)), plus lb_coef x the MoE load-balancing loss,
   plus mtp_coef x the MTP head's cross-entropy on the sampled tokens, not scaled by the advantage and, with
   `mtp_detach_trunk` (default), training the `mtp.*` params only (`hat_jax.train.mtp`: the head learns to
   predict the policy and leaves the policy gradient as it is; routing replay forces the main layers only).
   `routing_replay` (R3, arXiv 2510.11370) records the sampling-time top-k expert ids and forces them in
   the training forward; gate weights come from the live router logits. `ppo_epochs` x `ppo_minibatches`
   optimizer updates per rollout batch (default 1 x 1: one on-policy update, ratio = 1 up to numerics);
   the learning-rate schedule counts updates: it ends at steps x epochs x minibatches (`RLConfig.updates`)
   unless optim.total_steps is set.

Logged every step: reward, advantage, rollout, time, policy and KL tags (docs/metrics.md, "RL").

The model config and the tokenizer come from --init (`<init>/tokenizer` or its parent's, copied to
`<out>/tokenizer`); `--out` is the `StageCheckpointer` root and TensorBoard run directory, as for SFT.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Sequence
from pathlib import Path

import jax
import numpy as np

from hat_jax.data.world_data import WorldDataConfig, rl_tasks, world_for
from hat_jax.harness.hsa import HSAConfig, compose
from hat_jax.judges.rewards import RewardConfig
from hat_jax.model.params import COMPUTE_DTYPES
from hat_jax.model.sharding import default_mesh
from hat_jax.model.transformer import Qwen3_5MoeForCausalLM
from hat_jax.rollout.checkpoint import tokenizer_from_checkpoint
from hat_jax.sim.env import EnvConfig
from hat_jax.train import checkpoints as ckpt
from hat_jax.train.advantages import get_advantage_estimator
from hat_jax.train.losses import check_aggregation
from hat_jax.train.mtp import DEFAULT_MTP_COEF, check_mtp_coef, check_mtp_model
from hat_jax.train.optim import OptimConfig, lr_schedule, make_optimizer
from hat_jax.train.policy_packing import packed_update
from hat_jax.train.rl_loss import BATCH_KEYS, PACKED_KEYS, make_ref_logprobs, make_rl_train_step, rl_loss_fn
from hat_jax.train.rl_rewards import SHOWN, host_batch, judge_rewards, rollout_reading
from hat_jax.train.sft import load_init_params
from hat_jax.train.stage import (StageRun, copy_tokenizer, add_out_steps, add_resume_force, add_set_progress,
                                 apply_overrides, check_dtypes, check_model_options, check_run_fields, cli, config_json,
                                 finish_main, model_options, parse_stage_args, resolved_optim, run_options,
                                 stage_parser, stage_sampler, stage_section)
from hat_jax.train.trainer import LoopConfig, TrainState, batch_ways, place_batch, split_micro_batches

log = logging.getLogger(__name__)
HARNESS_MODES = ("original", "hsa")


def rl_fault_rates() -> dict[str, float]:
    """Tool-fault rates of the live-stream training episodes (RL, live OPD): as the SFT world's rollouts."""
    return {"error": 0.05, "timeout": 0.03, "empty": 0.02}


@dataclasses.dataclass(frozen=True)
class RLConfig:
    """One HSA-RL stage (its hash is checked on resume). See the module docstring for what each option does.

    Attributes:
      init: checkpoint to start from (required; a stage run dir or model checkpoint, with a tokenizer).
      ref: frozen reference for the k3 KL (None = init); loaded only when beta > 0.
      world: the world's datasets (RL tasks). harness_mode: "original" or "hsa". hsa: `compose` settings.
      env: episode limits (max_tool_rounds = 4) and fault rates.
      tasks_per_step, group_size: tasks per step and G episodes per task (N = their product rows).
      steps: RL steps (rollout batches). temperature, top_p: sampling. max_new_tokens: per turn.
      max_turns: model turns per episode. seq_len: cap on an episode's tokens.
      rollout_wave_rows: rows per decode call of the rollouts (the KV cache and prefill are sized by it; the
        rollouts equal one call over all rows), None = all rows at once. rollout_bucket: prompt/sequence padding
        bucket of the rollouts; train_bucket: the update's T is rounded up
        to a multiple of it (capped at seq_len), fewer shapes = fewer compilations.
      estimator: a name of `ADVANTAGE_ESTIMATORS` ("grpo", "gdpo", "dr_grpo", ...). reward: weights and the CoT
        penalty shape.
      eps_low, eps_high: clip range. beta: k3 KL coefficient. aggregation: loss aggregation mode.
      routing_replay: force sampling-time expert ids in the update. optim: AdamW + schedule.
      lb_coef: MoE load-balancing coefficient. mtp_coef: weight of the MTP loss on the sampled tokens
        (`hat_jax.train.mtp`; >= 0, 0 skips the MTP forward; default 0.1, DeepSeek-V3's lambda).
      mtp_detach_trunk: the MTP loss trains the `mtp.*` params only (True: the policy gradient is the same with
        and without it; False sends it into the trunk, embedding and lm_head as in SFT: `hat_jax.train.mtp`).
      pack_rows: the update packs several sampled sequences into one row where that saves rows
        (`hat_jax.train.policy_packing`: first-fit decreasing within each minibatch, row width unchanged; the
        loss equals the unpacked one up to float summation order). ppo_epochs, ppo_minibatches: updates per
        rollout batch.
      accum_steps: micro-batches per minibatch. compute_dtype: "float32" | "bfloat16" (rollouts and update;
        the frozen reference is held in it). param_dtype, mu_dtype, remat_policy, scan_layers, attention_impl, moe_impl, moe_token_chunk, vocab_chunk: as
        `SFTConfig`
        (vocab_chunk: the policy's and the reference's logprobs and entropy).
      log_every, ckpt_every, max_to_keep, seed, mesh: as `SFTConfig`.
    """

    init: str | None = None
    ref: str | None = None
    world: WorldDataConfig = WorldDataConfig(sft_tasks=0, eval_items=0)
    harness_mode: str = "hsa"
    hsa: HSAConfig = HSAConfig()
    env: EnvConfig = EnvConfig(fault_rates=rl_fault_rates())
    tasks_per_step: int = 8
    group_size: int = 8
    steps: int = 100
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    max_turns: int = 8
    seq_len: int = 4096
    rollout_bucket: int = 64
    rollout_wave_rows: int | None = None
    train_bucket: int = 256
    estimator: str = "grpo"
    reward: RewardConfig = RewardConfig()
    eps_low: float = 0.2
    eps_high: float = 0.28
    beta: float = 0.0
    aggregation: str = "token-mean"
    routing_replay: bool = False
    optim: OptimConfig = OptimConfig(lr=1e-5, warmup_steps=0, min_lr_ratio=1.0)
    lb_coef: float = 0.001
    mtp_coef: float = DEFAULT_MTP_COEF
    mtp_detach_trunk: bool = True
    pack_rows: bool = True
    ppo_epochs: int = 1
    ppo_minibatches: int = 1
    accum_steps: int = 1
    compute_dtype: str = "float32"
    param_dtype: str = "float32"
    mu_dtype: str | None = None
    remat_policy: str = "none"
    scan_layers: bool = False
    attention_impl: str = "auto"
    moe_impl: str = "blocked"
    moe_token_chunk: int | None = None
    vocab_chunk: int | None = None
    log_every: int = 1
    ckpt_every: int = 10
    max_to_keep: int = 3
    seed: int = 0
    mesh: tuple[int, ...] | None = None

    def __post_init__(self):
        check_run_fields(self)
        check_dtypes("RLConfig", param_dtype=self.param_dtype, mu_dtype=self.mu_dtype)
        check_model_options("RLConfig", self)
        check_mtp_coef("RLConfig", self.mtp_coef)
        if self.vocab_chunk is not None and self.vocab_chunk < 1:
            raise ValueError(f"RLConfig.vocab_chunk = {self.vocab_chunk}: expected >= 1 or None")
        get_advantage_estimator(self.estimator)      # ValueError listing the valid names
        check_aggregation(self.aggregation)
        if self.harness_mode not in HARNESS_MODES:
            raise ValueError(f"RLConfig.harness_mode = {self.harness_mode!r}; valid: {', '.join(HARNESS_MODES)}")
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"RLConfig.compute_dtype = {self.compute_dtype!r}; valid: {sorted(COMPUTE_DTYPES)}")
        for name in ("tasks_per_step", "group_size", "steps", "max_new_tokens", "max_turns", "rollout_bucket",
                     "train_bucket", "ppo_epochs", "ppo_minibatches", "accum_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"RLConfig.{name} = {getattr(self, name)}: expected >= 1")
        rows, split = self.tasks_per_step * self.group_size, self.ppo_minibatches * self.accum_steps
        if rows % split:
            raise ValueError(f"RLConfig: tasks_per_step x group_size = {rows} rows must be a multiple of "
                             f"ppo_minibatches x accum_steps = {split}")
        if not 0 < self.temperature or not 0 < self.top_p <= 1:
            raise ValueError(f"RLConfig: temperature ({self.temperature}) > 0 and top_p ({self.top_p}) in (0, 1]")
        if self.beta < 0 or self.eps_low < 0 or self.eps_high < 0:
            raise ValueError(f"RLConfig: beta ({self.beta}), eps_low, eps_high must be >= 0")

    @property
    def max_len(self) -> int:
        """L_max of the Dr.GRPO aggregation: the generation budget of an episode."""
        return min(self.max_turns * self.max_new_tokens, self.seq_len)

    @property
    def updates(self) -> int:
        """Optimizer updates of the run: steps x ppo_epochs x ppo_minibatches (the schedule's end when
        optim.total_steps is None)."""
        return self.steps * self.ppo_epochs * self.ppo_minibatches

    def to_json(self) -> dict:
        return config_json(self)


def apply_rl_overrides(config: RLConfig, assignments: Sequence[str]) -> RLConfig:
    """`key.path=value` overrides (`hat_jax.train.stage.apply_overrides`); the model comes from --init.

    Raises:
        ValueError: malformed assignment, unknown field (lists the valid ones), a `model.*` key.
    """
    return apply_overrides(config, assignments, no_model="--set {item}: the RL stage's model is the --init "
                                                         "checkpoint's; no model.* overrides")


# ---------------------------------------------------------------------------------------------- the batches

def draw_task_indices(n_tasks: int, count: int, seed: int, step: int) -> np.ndarray:
    """`count` distinct task indices of step `step`, from (seed, step) only (RL and live OPD draw alike)."""
    return np.random.default_rng([seed, step]).choice(n_tasks, count, replace=False)


def draw_harnesses(production, harness_mode: str, hsa: HSAConfig, seed: int, step: int, n: int) -> list:
    """One harness per task of step `step`: `production` ("original"), or ("hsa") its `compose(production,
    random.Random(s), hsa, "train")` variant with s drawn from (seed, step, task index i)."""
    if harness_mode == "original":
        return [production] * n
    seeds = [int(np.random.SeedSequence([seed, step, i]).generate_state(1)[0]) for i in range(n)]
    return [compose(production, random.Random(s), hsa, "train")[0] for s in seeds]


def step_task_indices(n_tasks: int, config: RLConfig, step: int) -> np.ndarray:
    """The step's `tasks_per_step` distinct task indices, from (seed, step) only."""
    return draw_task_indices(n_tasks, config.tasks_per_step, config.seed, step)


def step_harnesses(production, config: RLConfig, step: int, n: int) -> list:
    """One harness per task of the step: the production one, or its HSA composition seeded by (seed, step, i)."""
    return draw_harnesses(production, config.harness_mode, config.hsa, config.seed, step, n)


class RLBatches:
    """The on-policy batch function: `batches(state) -> host batch` for step state.step + 1 (module docstring).

    The host batch holds the device keys of `hat_jax.train.rl_loss` and "_metrics" (the step's reward /
    advantage / rollout / time scalars, reported through `run_stage`'s batch_metrics). The rollouts go through
    `sampler` (default: a `JaxSampler` of the model in `dtype` with the stage's rollout bucket), given each
    step's params by `with_params`.
    """

    def __init__(self, config: RLConfig, model_config, tokenizer, ref_params=None, dtype=None, sampler=None,
                 batch_ways: int = 1):
        from hat_jax.model.sampling import SamplingConfig
        from hat_jax.rollout import RolloutConfig
        from hat_jax.sim.world_harness import world_harness

        self.config, self.model_config, self.tokenizer = config, model_config, tokenizer
        self.tasks = rl_tasks(config.world)
        if len(self.tasks) < config.tasks_per_step:
            raise ValueError(f"RLConfig.tasks_per_step = {config.tasks_per_step} but world.rl_tasks gives only "
                             f"{len(self.tasks)} tasks")
        self.world = world_for(config.world.world_seed, config.world.n_products)
        self.production = world_harness(config.world.harness)
        self.dtype = dtype if dtype is not None else COMPUTE_DTYPES[config.compute_dtype]
        self.sampler = sampler if sampler is not None else stage_sampler(config, model_config, tokenizer, self.dtype,
                                                                         config.rollout_bucket)
        sampling = SamplingConfig(temperature=config.temperature, top_p=config.top_p,
                                  max_new_tokens=config.max_new_tokens)
        self.rollout_config = RolloutConfig(sampling, group_size=config.group_size, max_turns=config.max_turns,
                                            seq_len=config.seq_len, record_expert_ids=config.routing_replay,
                                            env=config.env)
        self.ref_params = ref_params
        self.rows_multiple = config.accum_steps * batch_ways   # packed rows per minibatch: whole micro-batches
        self.ref_fn = None
        if config.beta > 0:
            ref_model = Qwen3_5MoeForCausalLM(model_config, dtype=self.dtype, **model_options(config, train=False))
            self.ref_fn = make_ref_logprobs(ref_model, config.temperature, config.vocab_chunk)
        self.last_step = 0

    def rollout(self, params, step: int):
        """(RolloutBatch, harnesses) of step `step` under `params`."""
        from hat_jax.rollout import rollout_episodes

        c = self.config
        idx = step_task_indices(len(self.tasks), c, step)
        tasks = [self.tasks[i] for i in idx]
        harnesses = step_harnesses(self.production, c, step, len(tasks))
        rng = jax.random.fold_in(jax.random.fold_in(jax.random.key(c.seed), 2), step)
        batch = rollout_episodes(self.sampler.with_params(params), self.world, tasks, harnesses, rng,
                                 self.rollout_config)
        return batch, harnesses

    def __call__(self, state: TrainState) -> dict:
        step = int(jax.device_get(state.step)) + 1
        t0 = time.perf_counter()
        rollout, harnesses = self.rollout(state.params, step)
        t1 = time.perf_counter()
        components, counts = judge_rewards(rollout, harnesses, self.tokenizer, self.config.reward)
        t_env = time.perf_counter() - t1
        batch, metrics = host_batch(rollout, components, counts, self.config, pad_id=int(self.tokenizer.pad_token_id),
                                    ref_fn=self.ref_fn, ref_params=self.ref_params)
        c = self.config
        batch, rows = packed_update(batch, pack=c.pack_rows, aggregation=c.aggregation, max_len=c.max_len,
                                    minibatches=c.ppo_minibatches, rows_multiple=self.rows_multiple,
                                    top_k=self.model_config.num_experts_per_tok)
        metrics.update(rows)
        metrics.update(rollout_reading(rollout, harnesses))
        stats = rollout.stats
        metrics.update({"time/generation_s": stats["generation_s"], "time/env_s": stats["env_s"] + t_env,
                        "time/tokenize_s": stats["tokenizer_s"], "time/rollout_s": t1 - t0})
        batch["_metrics"] = metrics
        self.last_step = step
        return batch


# ---------------------------------------------------------------------------------------------- the stage

def _init_model_config(init: str | None):
    from hat_jax.model.checkpoint_io import resolve_checkpoint
    from hat_jax.model.hf_io import read_hf_config

    if init is None:
        raise ValueError("RLConfig.init: the RL stage needs an init checkpoint (--init)")
    path = Path(init)
    if not path.exists():
        raise FileNotFoundError(f"RL init checkpoint {str(path)!r} does not exist")
    try:
        _, config_path = resolve_checkpoint(path)
    except FileNotFoundError as err:
        raise FileNotFoundError(f"RL init checkpoint {str(path)!r}: {err}") from err
    try:
        return read_hf_config(config_path)
    except ValueError as err:
        raise ckpt.IncompatibleCheckpointError(f"RL init checkpoint {str(path)!r}: {err}") from err


def stage_tokenizer(init: str | None, out: Path, vocab_size: int):
    """`<out>/tokenizer` (a resumed run), else the init checkpoint's copied there (by process 0); loaded.

    Raises:
        FileNotFoundError: neither exists (names the init checkpoint).
        ValueError: more tokens than the model's vocab_size.
    """
    from hat_jax.tokenizer import load_tokenizer

    target = source = out / "tokenizer"
    if not (target / "tokenizer.json").is_file():
        source = tokenizer_from_checkpoint(init)
        if source is None:
            raise FileNotFoundError(f"RL init checkpoint {init!r} has no tokenizer (expected <init>/tokenizer or "
                                    f"<init>/../tokenizer with a tokenizer.json)")
        source = copy_tokenizer(source, target)
    tok = load_tokenizer(source)
    if len(tok) > vocab_size:
        raise ValueError(f"tokenizer {str(source)!r} has {len(tok)} tokens, more than the model's vocab_size "
                         f"{vocab_size}")
    return tok


def run_rl(config: RLConfig, out_dir: str | Path, *, resume: bool = False, force: bool = False,
           progress: bool = True) -> TrainState:
    """Runs the RL stage into `out_dir` (module docstring); returns the final state.

    Raises:
        FileExistsError: out_dir holds checkpoints and resume is False. FileNotFoundError: missing init/ref or
        tokenizer. ckpt.IncompatibleCheckpointError / ConfigMismatchError. NonFiniteLossError.
    """
    from hat_jax.model.checkpoint_io import CONFIG_FILE
    from hat_jax.model.hf_io import read_hf_config

    run = StageRun("rl", out_dir, config.to_json(), resume=resume, force=force, logger=log)
    out = run.out
    out.mkdir(parents=True, exist_ok=True)
    if run.existing is None:
        model_config = _init_model_config(config.init)
    else:
        model_config = read_hf_config(out / CONFIG_FILE)
    check_mtp_model("RLConfig", config.mtp_coef, model_config)
    mesh = default_mesh(config.mesh, model_config.num_experts)
    params = load_init_params(config.init, model_config, "RL init", mesh) if run.existing is None else None
    ref_params = None
    if config.beta > 0:
        ref_params = load_init_params(config.ref or config.init, model_config, "RL reference", mesh,
                                      config.compute_dtype)
    tokenizer = stage_tokenizer(config.init, out, model_config.vocab_size)
    batches = RLBatches(config, model_config, tokenizer, ref_params, batch_ways=batch_ways(mesh))

    optim = resolved_optim(config)
    optimizer = make_optimizer(optim, mu_dtype=COMPUTE_DTYPES[config.mu_dtype] if config.mu_dtype else None)
    state, _ = run.start(model_config, optimizer, mesh, params, config.seed, config.param_dtype)
    model = Qwen3_5MoeForCausalLM(model_config, dtype=COMPUTE_DTYPES[config.compute_dtype],
                                  **model_options(config))
    loss_fn = rl_loss_fn(model, temperature=config.temperature, eps_low=config.eps_low, eps_high=config.eps_high,
                         beta=config.beta, aggregation=config.aggregation, max_len=config.max_len,
                         routing_replay=config.routing_replay, vocab_chunk=config.vocab_chunk,
                         mtp=config.mtp_coef > 0, mtp_detach_trunk=config.mtp_detach_trunk)
    train_step = make_rl_train_step(loss_fn, optimizer, accum_steps=config.accum_steps, epochs=config.ppo_epochs,
                                    minibatches=config.ppo_minibatches, lb_coef=config.lb_coef,
                                    mtp_coef=config.mtp_coef,
                                    schedule=lr_schedule(optim), shardings=run.shardings)

    def step_fn(state, batch):
        t0 = time.perf_counter()
        state, metrics = train_step(state, batch)
        metrics = dict(jax.block_until_ready(metrics))
        metrics["time/train_s"] = time.perf_counter() - t0
        return state, metrics

    split = config.ppo_minibatches * config.accum_steps
    keys = (*BATCH_KEYS, *PACKED_KEYS, "ref_logprobs", "expert_ids")

    def prepare(host):
        return place_batch(split_micro_batches({k: v for k, v in host.items() if k in keys}, split), mesh)

    loop = LoopConfig(config.steps, config.log_every, config.ckpt_every, desc=f"rl[{config.harness_mode}]",
                      progress=progress, shown=SHOWN)
    return run.run(loop, state, batches, step_fn, max_to_keep=config.max_to_keep, prepare=prepare,
                   data_state=lambda: {"rl_step": batches.last_step}, batch_metrics=lambda host: host["_metrics"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = stage_parser("rl", __doc__)
    parser.add_argument("--init", required=True, help="checkpoint to start from (a stage run dir or model checkpoint "
                                                      "with a tokenizer/ folder)")
    add_out_steps(parser, steps_help="RL steps (also the schedule's end)")
    parser.add_argument("--harness", choices=HARNESS_MODES, help="original or HSA-perturbed harnesses")
    add_resume_force(parser)
    add_set_progress(parser, "estimator=gdpo, group_size=8, reward.cot_free=50")
    args = parse_stage_args(parser, argv)
    config = stage_section(args.preset, "rl")
    if args.harness is not None:
        config = dataclasses.replace(config, harness_mode=args.harness)
    config = dataclasses.replace(config, init=str(Path(args.init).resolve()))
    config = apply_rl_overrides(config, args.set)
    if args.steps is not None:
        config = dataclasses.replace(config, steps=args.steps)
    return finish_main(args, run_rl(config, args.out, **run_options(args)))


if __name__ == "__main__":
    cli(main, compile_cache=True)
