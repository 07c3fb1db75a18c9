"""The OPD stage's config (`OPDConfig`: the config is the experiment) and its prompt sources; the stage is
`hat_jax.train.opd`, its loss `hat_jax.train.opd_loss`, its batches `hat_jax.train.opd_batches`."""

from __future__ import annotations

import dataclasses

from hat_jax.data.world_data import WorldDataConfig
from hat_jax.harness.hsa import HSAConfig
from hat_jax.judges.rewards import RewardConfig
from hat_jax.model.params import COMPUTE_DTYPES
from hat_jax.sim.env import EnvConfig
from hat_jax.train.kl import check_opd_loss
from hat_jax.train.losses import check_aggregation
from hat_jax.train.mtp import DEFAULT_MTP_COEF, check_mtp_coef
from hat_jax.train.optim import OptimConfig
from hat_jax.train.rl import HARNESS_MODES, rl_fault_rates
from hat_jax.train.stage import check_dtypes, check_model_options, check_run_fields, config_json

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
        MTP forward; default 0.1, DeepSeek-V3's lambda). mtp_detach_trunk: the MTP loss trains the `mtp.*` params
        only (True: the distillation gradient is the same with and without it; `hat_jax.train.mtp`).
      pack_rows: the update packs several sampled sequences into one row where that saves rows
        (`hat_jax.train.policy_packing`, as `hat_jax.train.rl.RLConfig`; teacher outputs are packed with them).
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
    mtp_detach_trunk: bool = True
    pack_rows: bool = True
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
