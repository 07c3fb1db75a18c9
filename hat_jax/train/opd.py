"""The on-policy distillation (OPD) stage: the student samples answers to general-domain prompts ("general",
"tulu") or whole multi-turn episodes in the live-stream environment ("live") and is pulled toward a frozen
teacher by the per-token reverse KL along its own samples.

Run (the HAT chain passes the SFT run as --init and the pre-SFT base as --teacher; Table 5's distillation arm
passes the HSA-SFT(+OPD) run as --init and a stronger model with the same tokenizer as --teacher):

    python -m hat_jax.train.opd --preset micro|tiny --init CKPT [--teacher CKPT] --out DIR [--steps N]
        [--loss sampled|exact] [--resume [--force]] [--set prompts_per_step=8 --set optim.lr=1e-4 ...]
    python -m hat_jax.train.opd --preset micro_live|tiny_live --init CKPT --teacher CKPT --out DIR
        [--set harness_mode=hsa ...]        (or any preset with --set prompts=live --set seq_len=2048 ...)

Objective (issue 4 point 3; the HAT report, arXiv 2608.15763 (TaoLive, 2026), "Training, three stages",
stage 2): GKD with lambda = 1 and the reverse-KL end (Agarwal et al. 2024, arXiv 2306.13649),
KL_t = KL(pi_s(.|c_t) || pi_T(.|c_t)) on the student's sampled completions, as
`hat_jax.train.kl` implements it (its docstring states both estimators, their sources and their biases):
- "sampled" (default; Thinking Machines' OPD, K. Lu 2025, tinker-cookbook; marin's JAX
  `sampled_token_reverse_kl_opd_loss`): `sampled_reverse_kl_loss`, per-token advantage
  A_t = -kl_coef (log pi_old(y_t) - log pi_T(y_t)) with importance ratio pi_theta / pi_old and optional
  PPO clip `clip_eps`. Unbiased for the gradient of sum_t KL_t at fixed contexts on-policy (discount 0: it
  ignores y_t's effect on later KL terms); biased off-policy and where the clip is active.
- "exact" (NeMo-RL's "full"): `exact_reverse_kl`, the full-vocabulary KL_t differentiated directly (no
  estimator, no ratio; `clip_eps` unused); exact per position, contexts sampled from pi_old.
Both divide every logit by the sampling temperature. top_p < 1 samples from a truncated distribution while
the recorded and trained logprobs are untruncated: biased (TRL #6789); the presets keep top_p = 1.

One step (`OPDBatches`, the callable batch source of `hat_jax.train.trainer.run_stage`), prompts "general"/"tulu":
1. prompts: `prompts_per_step` drawn without replacement from the pool by np.random.default_rng((seed,
   step)); the pool is `general_prompts(prompt_pool, seed, "train")` (IFEval-style, "general") or
   `load_tulu_prompts(prompt_pool, seed, source=tulu_path)` ("tulu"; a local copy, the hub is offline), with
   prompts longer than seq_len - max_new_tokens tokens dropped. Each is [{"role": "user", "content": p}],
   rendered by the tokenizer's chat template with the generation prompt (thinking on: `<think>\\n`), no tools.
2. sampling: `sample_completions` with the *current* student params, `samples_per_prompt` per prompt,
   rng = fold_in(fold_in(key(seed), 2), step): a resumed run samples exactly what the killed one did.
   Rows are right-padded to seq_len (one training shape, one compilation; padding costs compute), or with
   `train_bucket` set to a multiple of it (at most seq_len).
3. teacher: a jitted forward of the frozen teacher over the sampled rows, outside the gradient, one
   micro-batch at a time, giving teacher token logprobs [B, T] (both losses: the sampled loss and the
   k1/k3 metrics) and, for "exact", its final hidden states [B, T, H_T]. The exact loss computes the teacher
   logits inside the loss function from those hidden states and the teacher's lm_head kernel, passed with the
   batch (broadcast over the accumulation axis, under stop_gradient): memory B*T*H_T + accum*H_T*V instead of
   a [B, T, V] teacher-logit array; with `vocab_chunk` set, neither model's [B, T, V] logits ever exist
   (`reverse_kl_per_token_chunked`). The teacher may be a different architecture with the same vocabulary.
4. update: `make_train_step` over the loss below, micro-batched by accum_steps.

prompts "live" (Table 5 of the HAT report: RL versus distillation from a strong teacher in the same
environment, from the same checkpoint). Steps 1-2 become the RL stage's rollout (`hat_jax.train.rl`, with
the same draws: `draw_task_indices` / `draw_harnesses` are shared, so with equal seed, world and counts both
arms see the same tasks and harness variants at each step): `prompts_per_step` distinct tasks of
`rl_tasks(world)` drawn by (seed, step); harness `harness_mode` = "original" (the production harness) or
"hsa" (`compose(production, Random(s), hsa, "train")`, s from (seed, step, task index)); `rollout_batch`
with the current student params, `samples_per_prompt` episodes per task, at most `max_turns` model turns of
`max_new_tokens` each, `env` (tool rounds, faults), sequences capped at seq_len, rng `sampling_key`. The
sequence of an episode is prompt + sampled + environment (tool responses, hook feedback, next generation
prompt) + sampled ... tokens; the action mask is 1 exactly on the sampled tokens, so the environment's
tokens are context for both models and never trained on. Step 3 is unchanged: the teacher forwards the whole
sequences and only the action positions enter the loss (either loss: the exact KL is computed at every
position and masked the same way). Why on-policy episodes rather than teacher episodes: GKD's lambda = 1
(the student's own states, including the environment's answers to its own tool calls), which is what RL
trains on too, so the two arms differ only in the learning signal (teacher KL vs judge rewards). The
judges (`hat_jax.train.rl_rewards.judge_rewards`, `reward` = RL's CoT-penalty shape) score the sampled
episodes for the metrics only; they do not enter the loss. `enable_thinking` must stay True (the harness
renders the prompt; thinking is always on).

Loss function (params, micro, rng) -> (loss_sum, n, aux): loss_sum = `aggregate(per-token loss, action_mask,
aggregation, total_tokens=1, total_sequences=1)`, i.e. the aggregation's numerator, and n its denominator
(loss tokens for "token-mean"; rows with at least one action token for "seq-mean-token-mean" and
"seq-mean-token-sum-norm", whose constant L_max is max_new_tokens, or for "live" min(max_turns x
max_new_tokens, seq_len) as RL's), so the trainer's sum(loss_sum) / sum(n) over micro-batches equals the full
batch's aggregate. Plus lb_coef x the MoE load-balancing loss. The MTP block gets no gradient.

Metrics (tags of `hat_jax.train.metrics`): train/loss (the OPD objective), kl/reverse_k1 and kl/reverse_k3
(token means of the k1 and k3 estimates of KL(pi_old || pi_T) on the sampled tokens, both losses),
kl/reverse_exact ("exact": the exact KL under the current params), policy/clip_frac (0 for "exact"),
policy/ratio_mean, policy/entropy (exact entropy of the student's next-token distribution at the sampled
positions), rollout/completion_len, rollout/finished_frac (ended with <|im_end|>), rollout/gen_tokens_per_s,
time/generation_s, time/teacher_s, time/train_s (the first step includes compilation). For "live"
(the RL stage's names, so `tensorboard` overlays the two arms): rollout/completion_len is the sampled tokens
per episode and rollout/finished_frac the share of episodes not cut (`RolloutBatch.truncated`), plus
reward/<component> (mean over episodes of `hat_jax.judges.rewards.COMPONENTS`: accuracy, effectiveness,
tool_rationality, skill_selection, cot_length) and reward/total (weighted by `reward.weights`),
rollout/turns, rollout/truncated_frac, rollout/reasoning_len (reasoning tokens per sampled turn),
rollout/tokens, rollout/seq_len, rollout/outcome_<name> (`OUTCOMES`), time/env_s (environment + judges),
time/tokenize_s, time/rollout_s.

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
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hat_jax.data.world_data import WorldDataConfig
from hat_jax.harness.hsa import HSAConfig
from hat_jax.judges.rewards import COMPONENTS, RewardConfig, weighted_reward
from hat_jax.model.params import params_logical_axes, params_shapes
from hat_jax.model.sampler import SamplingConfig
from hat_jax.model.sharding import logical_to_mesh
from hat_jax.model.transformer import Qwen3_5MoeForCausalLM
from hat_jax.sim.env import EnvConfig
from hat_jax.train import checkpoints as ckpt
from hat_jax.train.kl import OPD_LOSSES, check_opd_loss, exact_reverse_kl, sampled_reverse_kl_loss
from hat_jax.train.losses import (check_aggregation, masked_mean, running_logsumexp, token_logprobs,
                                  token_logprobs_chunked, vocab_chunk_logits)
from hat_jax.train.optim import OptimConfig, lr_schedule, make_optimizer
from hat_jax.train.rl import HARNESS_MODES, draw_harnesses, draw_task_indices, rl_fault_rates
from hat_jax.train.rl_loss import counted_sequences
from hat_jax.train.rl_rewards import OUTCOMES, judge_rewards
from hat_jax.train.rollout_tokens import encode, round_up, sample_completions
from hat_jax.train.sft import tokenizer_from_checkpoint, with_steps
from hat_jax.train.stage import (COMPUTE_DTYPES, StageRun, add_out_steps, add_resume_force, add_set_progress,
                                 apply_overrides, cli, config_json, finish_main, parse_stage_args, run_options,
                                 stage_parser)
from hat_jax.train.trainer import (LoopConfig, TrainState, default_mesh, make_train_step, moe_aux, place_batch,
                                   split_micro_batches)

log = logging.getLogger(__name__)
PROMPT_SOURCES = ("general", "tulu", "live")
SAMPLED_KEYS = ("input_ids", "attention_mask", "action_mask", "old_logprobs", "teacher_logprobs")
EXACT_KEYS = SAMPLED_KEYS + ("teacher_hidden",)


@dataclasses.dataclass(frozen=True)
class OPDConfig:
    """One OPD stage (the config is the experiment; its hash is checked on resume).

    Attributes:
      preset: name of the preset the stage came from (the model is the init checkpoint's).
      init: student checkpoint (a model checkpoint or a stage's run dir); required.
      teacher: frozen teacher checkpoint; None = the student's init. In the HAT chain the teacher is the
        pre-SFT base, passed explicitly (--teacher), while --init is the SFT run.
      loss: "sampled" | "exact" (`OPD_LOSSES`, module docstring).
      prompts: "general" (IFEval-style train split) | "tulu" (`tulu_path`, a local Tulu-3 copy) | "live"
        (multi-turn episodes in the live-stream environment, module docstring).
      prompt_pool: prompts drawn into the pool ("general"/"tulu"). prompts_per_step, samples_per_prompt:
        B = their product ("live": tasks per step and episodes per task).
      temperature, top_p: sampling (logprobs use the same temperature). max_new_tokens: completion budget
        ("live": per model turn). seq_len: the cap on a row's tokens (prompt + completion, or a whole episode).
      bucket: prompt-length bucket of the sampler (compilations). train_bucket: None = rows padded to seq_len
        (one shape); else to a multiple of it, at most seq_len. enable_thinking: chat-template switch
        ("general"/"tulu"; must be True for "live").
      harness_mode, hsa, world, env, max_turns, reward ("live" only, as `hat_jax.train.rl.RLConfig`):
        "original" | "hsa" harnesses and the `compose` settings; the RL tasks' world; episode limits and
        tool faults; model turns per episode; the CoT-penalty shape and weights of the logged judge rewards.
      clip_eps: PPO clip of the sampled loss (None = no clip). kl_coef: scale of the KL (advantage or loss).
      aggregation: `hat_jax.train.losses.AGGREGATIONS`. vocab_chunk: None = full logits; else the
        vocabulary chunk of the chunked logprob/KL/entropy computations.
      optim, accum_steps, lb_coef, compute_dtype, steps, log_every, ckpt_every, max_to_keep, seed, mesh: as SFT.
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
    compute_dtype: str = "float32"
    steps: int = 100
    log_every: int = 10
    ckpt_every: int = 50
    max_to_keep: int = 3
    seed: int = 0
    mesh: tuple[int, int, int, int] | None = None

    def __post_init__(self):
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

    def to_json(self) -> dict:
        return config_json(self)


# The live-stream fields (world, max_turns, train_bucket) of "micro"/"tiny" are RL's presets' (same tasks), inert
# for general prompts; "*_live" add the sequence lengths the harness's prompts need.
_MICRO = OPDConfig(preset="micro", prompt_pool=64, prompts_per_step=2, samples_per_prompt=2, max_new_tokens=16,
                   seq_len=192, bucket=192, world=WorldDataConfig(sft_tasks=0, rl_tasks=16, eval_items=0), max_turns=2,
                   optim=OptimConfig(lr=1e-3, warmup_steps=0, total_steps=4, weight_decay=0.0),
                   steps=4, log_every=1, ckpt_every=2)
_TINY = OPDConfig(preset="tiny", prompt_pool=1000, prompts_per_step=8, samples_per_prompt=4, max_new_tokens=128,
                  seq_len=256, bucket=128, train_bucket=512, max_turns=6,
                  world=WorldDataConfig(sft_tasks=0, rl_tasks=400, eval_items=0),
                  optim=OptimConfig(lr=2e-4, warmup_steps=5, total_steps=50, weight_decay=0.0),
                  steps=50, log_every=5, ckpt_every=25)
OPD_PRESETS: dict[str, OPDConfig] = {
    # Tests: general prompts are <= 161 tokens with a 512-token BPE; bucket = seq_len: one sampler compilation.
    "micro": _MICRO,
    # CPU experiments (the speed figure in the closing note is for this preset). Prompts must fit in
    # seq_len - max_new_tokens = 128 tokens, so bucket 128 gives one sampler compilation.
    "tiny": _TINY,
    # Live-stream OPD (Table 5) with a 4,096-token vocabulary: production prompts ~900-1,400 tokens, HSA ones up
    # to ~2,000 (as RL's micro); prompts and rows padded to seq_len (one sampler and one training shape: the
    # HSA prompts' lengths vary, and a compilation per 256-token bucket cost more than the padding).
    "micro_live": dataclasses.replace(_MICRO, preset="micro_live", prompts="live", seq_len=2048, bucket=2048),
    # As RL's tiny (tasks x episodes 4 x 4, 6 turns of 128 tokens, rows in 512-token buckets, 4 micro-batches) but
    # 512-token prompt buckets (RL's 128 compiled the sampler for ~4x more shapes: 27 s vs 10 s of generation at
    # step 3 on 2 CPU cores, random weights).
    "tiny_live": dataclasses.replace(_TINY, preset="tiny_live", prompts="live", prompts_per_step=4, seq_len=3072,
                                     bucket=512, accum_steps=4),
}


_LIVE_PRESETS = tuple(name for name, c in OPD_PRESETS.items() if c.prompts == "live")


def opd_preset(name: str) -> OPDConfig:
    if name not in OPD_PRESETS:
        raise ValueError(f"unknown OPD preset {name!r}; valid: {', '.join(OPD_PRESETS)}")
    return OPD_PRESETS[name]


def apply_opd_overrides(config: OPDConfig, assignments: Sequence[str]) -> OPDConfig:
    """`key.path=value` assignments (`hat_jax.train.stage.apply_overrides`); the model is the init's, so
    `model.*` keys are refused."""
    return apply_overrides(config, assignments, no_model="--set {item!r}: the OPD student's architecture is its "
                                                         "--init checkpoint's; model fields cannot be overridden")


# ---------------------------------------------------------------------------------------------- loss


def _entropy(logits: jax.Array, temperature: float) -> jax.Array:
    """[B, T, V] -> [B, T] entropy of the next-token distribution (entry t: of position t-1's logits)."""
    lp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32) / temperature, axis=-1)
    return jnp.pad(-jnp.sum(jnp.exp(lp) * lp, axis=-1), ((0, 0), (1, 0)))


def _entropy_chunked(hidden: jax.Array, kernel: jax.Array, chunk: int, temperature: float, compute_dtype) -> jax.Array:
    """`_entropy(hidden @ kernel)` over vocabulary chunks: H = lse - sum_v e^(z_v - m) z_v / S (no gradient)."""
    b, t, h = hidden.shape
    vocab = kernel.shape[1]
    size = min(int(chunk), vocab)
    x = jax.lax.stop_gradient(hidden[:, :-1].reshape(-1, h))
    k = jax.lax.stop_gradient(kernel)

    def body(carry, i):
        m, s, w = carry
        z, _, fresh = vocab_chunk_logits(x, k, i, size, temperature, compute_dtype)
        m, s, e, scale = running_logsumexp(m, s, z, fresh)
        return (m, s, w * scale + jnp.sum(e * jnp.where(fresh[None, :], z, 0.0), axis=-1)), None

    rows = x.shape[0]
    init = (jnp.full((rows,), -jnp.inf, jnp.float32), jnp.zeros((rows,), jnp.float32), jnp.zeros((rows,), jnp.float32))
    (m, s, w), _ = jax.lax.scan(body, init, jnp.arange(-(-vocab // size)))
    return jnp.pad((m + jnp.log(s) - w / s).reshape(b, t - 1), ((0, 0), (1, 0)))


def opd_loss_fn(model: Qwen3_5MoeForCausalLM, config: OPDConfig):
    """loss_fn(params, micro, rng) -> (aggregation numerator, its denominator, aux) (module docstring).

    micro: input_ids/attention_mask/action_mask [b, T] int32, old_logprobs/teacher_logprobs [b, T] float32;
    for "exact" also teacher_hidden [b, T, H_T] and teacher_kernel [H_T, V] (held out of the gradient).
    """
    chunk, temp, cd = config.vocab_chunk, config.temperature, COMPUTE_DTYPES[config.compute_dtype]
    top_k = model.config.num_experts_per_tok
    agg = dict(aggregation=config.aggregation, max_len=config.max_len, total_tokens=1.0, total_sequences=1.0)
    sg = jax.lax.stop_gradient

    def loss_fn(params, micro, rng):
        del rng  # no dropout
        ids, att, m = micro["input_ids"], micro["attention_mask"], micro["action_mask"]
        old, tlp = micro["old_logprobs"], micro["teacher_logprobs"]
        out = model.apply({"params": params}, ids, attention_mask=att, return_logits=chunk is None)
        kernel = params["lm_head"]["kernel"]
        if chunk is None:
            lp, ent = token_logprobs(out.logits, ids, temp), _entropy(sg(out.logits), temp)
        else:
            lp = token_logprobs_chunked(out.hidden, kernel, ids, chunk, temp, cd)
            ent = _entropy_chunked(out.hidden, kernel, chunk, temp, cd)
        aux = moe_aux(out.router_logits, att, top_k)
        if config.loss == "sampled":
            loss_sum, met = sampled_reverse_kl_loss(lp, old, tlp, m, clip_eps=config.clip_eps, kl_coef=config.kl_coef,
                                                    **agg)
            aux["policy/clip_frac"] = met["clip_frac"]
        else:
            th, tk = sg(micro["teacher_hidden"]), sg(micro["teacher_kernel"])
            if chunk is None:
                t_logits = jnp.dot(th.reshape(-1, th.shape[-1]).astype(cd), tk.astype(cd)).reshape(*ids.shape, -1)
                loss_sum, met = exact_reverse_kl(out.logits, t_logits, m, temperature=temp, **agg)
            else:
                loss_sum, met = exact_reverse_kl((out.hidden, kernel), (th, tk), m, chunk=chunk, temperature=temp,
                                                 compute_dtype=cd, **agg)
            loss_sum = config.kl_coef * loss_sum
            aux["kl/reverse_exact"] = met["reverse_kl"]
            aux["policy/clip_frac"] = jnp.zeros((), jnp.float32)
        k1 = old.astype(jnp.float32) - tlp.astype(jnp.float32)
        aux["kl/reverse_k1"] = masked_mean(k1, m)
        aux["kl/reverse_k3"] = masked_mean(jnp.exp(-k1) - 1.0 + k1, m)
        aux["policy/ratio_mean"] = masked_mean(jnp.exp(sg(lp) - old), m)
        aux["policy/entropy"] = masked_mean(ent, m)
        n = jnp.sum(m.astype(jnp.float32)) if config.aggregation == "token-mean" else counted_sequences(m)
        return loss_sum, n, aux

    return loss_fn


# ---------------------------------------------------------------------------------------------- batches


def make_teacher_fn(model: Qwen3_5MoeForCausalLM, config: OPDConfig):
    """Jitted (teacher params, ids [b, T], mask [b, T]) -> {teacher_logprobs [b, T] float32 (at the sampling
    temperature), + teacher_hidden [b, T, H] for "exact"}."""
    chunk, temp, cd = config.vocab_chunk, config.temperature, COMPUTE_DTYPES[config.compute_dtype]

    @jax.jit
    def fn(params, ids, mask):
        out = model.apply({"params": params}, ids, attention_mask=mask, return_logits=chunk is None)
        if chunk is None:
            lp = token_logprobs(out.logits, ids, temp)
        else:
            lp = token_logprobs_chunked(out.hidden, params["lm_head"]["kernel"], ids, chunk, temp, cd)
        res = {"teacher_logprobs": lp}
        if config.loss == "exact":
            res["teacher_hidden"] = out.hidden
        return res

    return fn


def prompt_pool(config: OPDConfig, tokenizer) -> list[list[dict]]:
    """The stage's prompts as chat messages, those longer than seq_len - max_new_tokens tokens dropped.

    Raises:
      ValueError: no prompt fits (names seq_len and the shortest prompt's length).
    """
    if config.prompts == "general":
        from hat_jax.data.general import general_prompts

        texts = [p.prompt for p in general_prompts(config.prompt_pool, config.seed, "train")]
    else:
        from hat_jax.data.hub import load_tulu_prompts

        texts = [p.prompt for p in load_tulu_prompts(config.prompt_pool, config.seed, source=config.tulu_path)]
    kwargs = {} if config.enable_thinking else {"enable_thinking": False}
    pool, lengths = [], []
    for text in texts:
        messages = [{"role": "user", "content": text}]
        n = len(encode(tokenizer, tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                                **kwargs)))
        lengths.append(n)
        if n + config.max_new_tokens <= config.seq_len:
            pool.append(messages)
    if not pool:
        raise ValueError(f"no {config.prompts} prompt fits seq_len={config.seq_len} with max_new_tokens="
                         f"{config.max_new_tokens} (shortest prompt: {min(lengths, default=0)} tokens)")
    if len(pool) < len(texts):
        log.info("OPD prompt pool: %d of %d prompts fit seq_len %d", len(pool), len(texts), config.seq_len)
    return pool


@dataclasses.dataclass(frozen=True)
class LiveTasks:
    """The "live" pool: the RL tasks, the catalog they run over and the production harness."""

    tasks: tuple
    world: Any
    production: Any


def live_pool(config: OPDConfig, tokenizer) -> LiveTasks:
    """`rl_tasks(config.world)` with their world and the production harness, checked against seq_len.

    Raises:
      ValueError: fewer tasks than prompts_per_step, or the first task's production-harness prompt leaves less
        than max_new_tokens below seq_len (names both and the live presets; HSA prompts are longer still).
    """
    from hat_jax.data.world_data import rl_tasks, world_for
    from hat_jax.harness.loader import production_harness
    from hat_jax.harness.render import render_text
    from hat_jax.sim.env import LiveStreamEnv

    tasks = rl_tasks(config.world)
    if len(tasks) < config.prompts_per_step:
        raise ValueError(f"OPDConfig.prompts_per_step = {config.prompts_per_step} but world.rl_tasks gives only "
                         f"{len(tasks)} tasks")
    world, production = world_for(config.world.world_seed, config.world.n_products), production_harness()
    messages = LiveStreamEnv(world, config.env).reset(tasks[0], production)
    n = len(encode(tokenizer, render_text(tokenizer, production, messages, add_generation_prompt=True)))
    if n + config.max_new_tokens > config.seq_len:
        raise ValueError(f"OPDConfig.seq_len = {config.seq_len}: a live-stream prompt has {n} tokens under the "
                         f"production harness (more under HSA), no room for max_new_tokens = {config.max_new_tokens}; "
                         f"raise seq_len (--set seq_len=...) or use a live preset ({', '.join(_LIVE_PRESETS)})")
    return LiveTasks(tuple(tasks), world, production)


def live_metrics(rollout, components: dict[str, np.ndarray], counts: list[list[int]],
                 reward: RewardConfig) -> dict[str, float]:
    """The "live" step's rollout and judge-reward scalars (tags as the RL stage's; module docstring).

    Args:
      rollout: the step's `RolloutBatch` (N episodes). components: {component: [N]} (`judge_rewards`).
      counts: reasoning tokens per sampled turn of each episode. reward: the weights of reward/total.
    """
    n = len(rollout.episodes)
    stats = rollout.stats

    def mean(x) -> float:
        x = np.asarray(x, np.float64)
        x = x[np.isfinite(x)]
        return float(np.mean(x)) if x.size else float("nan")

    out = {f"reward/{k}": mean(components[k]) for k in COMPONENTS}
    weights = {k: float(w) for k, w in reward.weights.items() if k in COMPONENTS}
    out["reward/total"] = mean([weighted_reward({k: components[k][i] for k in COMPONENTS}, weights) for i in range(n)])
    truncated = float(np.mean(rollout.truncated))
    out.update({"rollout/completion_len": float(np.sum(rollout.action_mask)) / n,
                "rollout/finished_frac": 1.0 - truncated, "rollout/truncated_frac": truncated,
                "rollout/gen_tokens_per_s": float(stats["tokens_per_s"]),
                "rollout/tokens": float(stats["tokens_generated"]), "rollout/turns": float(stats["mean_turns"]),
                "rollout/reasoning_len": mean([c for episode in counts for c in episode]),
                "rollout/seq_len": mean(stats["seq_lens"])})
    outcomes = dict(stats["outcomes"])
    for name in sorted(set(OUTCOMES) | set(outcomes)):
        out[f"rollout/outcome_{name}"] = outcomes.get(name, 0) / n
    return out


def step_prompt_ids(config: OPDConfig, pool_size: int, step: int) -> np.ndarray:
    """Indices of step `step`'s prompts in the pool: a function of (seed, step) only."""
    rng = np.random.default_rng((config.seed, step))
    return rng.choice(pool_size, size=config.prompts_per_step, replace=pool_size < config.prompts_per_step)


def sampling_key(config: OPDConfig, step: int) -> jax.Array:
    """The sampler's key for step `step`: fold_in(fold_in(key(seed), 2), step)."""
    return jax.random.fold_in(jax.random.fold_in(jax.random.key(config.seed), 2), step)


def _pad_to(batch: dict, length: int, pad_id: int) -> dict:
    out = dict(batch)
    for k, v in batch.items():
        if isinstance(v, np.ndarray) and v.ndim == 2 and v.shape[1] < length:
            out[k] = np.pad(v, ((0, 0), (0, length - v.shape[1])), constant_values=pad_id if k == "input_ids" else 0)
    return out


class OPDBatches:
    """The stage's batch source: `batches(state)` -> the host batch of step state.step + 1 (module docstring).

    The host batch: input_ids, attention_mask, action_mask [B, T] int32, old_logprobs, teacher_logprobs
    [B, T] float32 (+ teacher_hidden [B, T, H_T] for "exact"), T = seq_len or its `train_bucket` multiple, and
    "stats" (the step's rollout / reward / time scalars). "live" adds "harnesses" (one per task) and "rollout"
    (the `RolloutBatch`).

    Args:
      config: the stage. model_config: the student's. tokenizer: shared by both models.
      pool: chat prompts (`prompt_pool`) or, for "live", a `LiveTasks` (`live_pool`). teacher_params: frozen.
      teacher_model: the teacher's module. generate_fn: the sampler (tests may pass a scripted one).
    """

    def __init__(self, config: OPDConfig, model_config, tokenizer, pool, teacher_params, teacher_model,
                 generate_fn=None):
        self.config, self.model_config, self.tokenizer, self.pool = config, model_config, tokenizer, pool
        self.teacher_params, self.teacher_fn = teacher_params, make_teacher_fn(teacher_model, config)
        self.sampling = SamplingConfig(temperature=config.temperature, top_p=config.top_p,
                                       max_new_tokens=config.max_new_tokens)
        self.extra = {} if generate_fn is None else {"generate_fn": generate_fn}

    def _completions(self, params, step: int) -> tuple[dict, dict]:
        c = self.config
        prompts = [self.pool[i] for i in step_prompt_ids(c, len(self.pool), step)]
        t0 = time.perf_counter()
        rows = sample_completions(params, self.model_config, self.tokenizer, prompts, self.sampling,
                                  sampling_key(c, step), c.samples_per_prompt, c.seq_len,
                                  dtype=COMPUTE_DTYPES[c.compute_dtype], bucket=c.bucket,
                                  template_kwargs=None if c.enable_thinking else {"enable_thinking": False},
                                  **self.extra)
        dt = time.perf_counter() - t0
        comp = rows["completion_lengths"]
        return rows, {"rollout/completion_len": float(np.mean(comp)),
                      "rollout/finished_frac": float(np.mean(rows["finished"])),
                      "rollout/gen_tokens_per_s": float(np.sum(comp)) / max(dt, 1e-9), "time/generation_s": dt}

    def _episodes(self, params, step: int) -> tuple[dict, dict]:
        from hat_jax.train.rollout import rollout_batch

        c, pool = self.config, self.pool
        tasks = [pool.tasks[i] for i in draw_task_indices(len(pool.tasks), c.prompts_per_step, c.seed, step)]
        harnesses = draw_harnesses(pool.production, c.harness_mode, c.hsa, c.seed, step, len(tasks))
        t0 = time.perf_counter()
        rollout = rollout_batch(params, self.model_config, self.tokenizer, pool.world, tasks, harnesses, c.env,
                                self.sampling, c.samples_per_prompt, sampling_key(c, step), max_turns=c.max_turns,
                                seq_len=c.seq_len, dtype=COMPUTE_DTYPES[c.compute_dtype], bucket=c.bucket,
                                **self.extra)
        t1 = time.perf_counter()
        components, counts = judge_rewards(rollout, harnesses, self.tokenizer, c.reward)
        stats = live_metrics(rollout, components, counts, c.reward)
        stats.update({"time/generation_s": rollout.stats["generation_s"],
                      "time/env_s": rollout.stats["env_s"] + time.perf_counter() - t1,
                      "time/tokenize_s": rollout.stats["tokenizer_s"], "time/rollout_s": t1 - t0})
        rows = {k: getattr(rollout, k) for k in ("input_ids", "attention_mask", "action_mask", "old_logprobs")}
        return {**rows, "harnesses": harnesses, "rollout": rollout}, stats

    def __call__(self, state: TrainState) -> dict[str, Any]:
        c = self.config
        step = int(jax.device_get(state.step)) + 1
        rows, stats = (self._episodes if c.prompts == "live" else self._completions)(state.params, step)
        t1 = time.perf_counter()
        length = c.seq_len if c.train_bucket is None else min(round_up(rows["input_ids"].shape[1], c.train_bucket),
                                                               c.seq_len)
        batch = _pad_to(rows, length, int(self.tokenizer.pad_token_id))
        micro = c.rows // c.accum_steps
        parts = [self.teacher_fn(self.teacher_params, batch["input_ids"][i:i + micro],
                                 batch["attention_mask"][i:i + micro]) for i in range(0, c.rows, micro)]
        teacher = jax.device_get(parts)
        for key in teacher[0]:
            batch[key] = np.concatenate([p[key] for p in teacher])
        batch["stats"] = {**stats, "time/teacher_s": time.perf_counter() - t1}
        return batch


# ---------------------------------------------------------------------------------------------- the stage


def _checkpoint_config(path: str, role: str):
    from hat_jax.model.checkpoint_io import resolve_checkpoint
    from hat_jax.model.hf_io import read_hf_config

    if not Path(path).exists():
        raise FileNotFoundError(f"OPD {role} checkpoint {path!r} does not exist")
    try:
        return read_hf_config(resolve_checkpoint(path)[1])
    except ValueError as err:
        raise ckpt.IncompatibleCheckpointError(f"OPD {role} checkpoint {path!r}: {err}") from err


def load_checkpoint(path: str, role: str):
    """(model config, params as float32) of a model checkpoint or run dir; errors name the role and path.

    Raises:
      FileNotFoundError: missing checkpoint or params. IncompatibleCheckpointError: unreadable or mismatched.
    """
    from hat_jax.model.checkpoint_io import load_model_checkpoint

    _checkpoint_config(path, role)
    try:
        model_config, params = load_model_checkpoint(path)
    except FileNotFoundError as err:
        raise FileNotFoundError(f"OPD {role} checkpoint {path!r}: {err}") from err
    except ValueError as err:
        raise ckpt.IncompatibleCheckpointError(f"OPD {role} checkpoint {path!r}: {err}") from err
    expected = params_shapes(model_config)
    return model_config, jax.tree_util.tree_map(lambda p, e: jnp.asarray(p, e.dtype), params, expected)


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
    if source != target:
        tmp = Path(tempfile.mkdtemp(dir=out_dir, prefix=".tokenizer."))
        shutil.copytree(source, tmp, dirs_exist_ok=True)
        os.replace(tmp, target) if not target.exists() else shutil.rmtree(tmp)
    tok = load_tokenizer(target)
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
            progress: bool = True, generate_fn=None) -> TrainState:
    """Runs the OPD stage into `out_dir` (module docstring); returns the final state.

    Args:
      resume: continue from the latest checkpoint in out_dir. force: resume despite a config-hash mismatch.
      generate_fn: replaces the sampler (tests).
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
        model_config, params = load_checkpoint(config.init, "student init")
    else:
        model_config, params = _checkpoint_config(config.init, "student init"), None
    teacher_config, teacher_params = load_checkpoint(config.teacher, "teacher")
    if teacher_config.vocab_size != model_config.vocab_size:
        raise ckpt.IncompatibleCheckpointError(
            f"OPD teacher checkpoint {config.teacher!r} has vocab_size {teacher_config.vocab_size}, the student "
            f"{config.init!r} {model_config.vocab_size}: the two must share a tokenizer")
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = opd_tokenizer(config, model_config.vocab_size, out)
    pool = live_pool(config, tokenizer) if config.prompts == "live" else prompt_pool(config, tokenizer)

    optimizer = make_optimizer(config.optim)
    mesh = default_mesh(config.mesh)
    state, _ = run.start(model_config, optimizer, mesh, params, config.seed)
    if run.shardings is not None:
        teacher_params = jax.device_put(teacher_params, logical_to_mesh(params_logical_axes(teacher_config),
                                                                        teacher_params, mesh))
    dtype = COMPUTE_DTYPES[config.compute_dtype]
    model = Qwen3_5MoeForCausalLM(model_config, dtype=dtype)
    teacher_model = Qwen3_5MoeForCausalLM(teacher_config, dtype=dtype)
    train_step = make_train_step(opd_loss_fn(model, config), optimizer, lb_coef=config.lb_coef,
                                 schedule=lr_schedule(config.optim), shardings=run.shardings)
    batches = OPDBatches(config, model_config, tokenizer, pool, teacher_params, teacher_model, generate_fn)
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
    parser = stage_parser("opd", __doc__, f"OPD preset: {', '.join(OPD_PRESETS)}")
    parser.add_argument("--init", required=True, help="student checkpoint (model checkpoint or a stage's run dir)")
    parser.add_argument("--teacher", help="frozen teacher checkpoint (default: --init; in HAT: the pre-SFT base)")
    add_out_steps(parser)
    parser.add_argument("--loss", choices=OPD_LOSSES, help="reverse-KL loss: sampled-token estimator or exact")
    add_resume_force(parser)
    add_set_progress(parser, "prompts_per_step=8, optim.lr=1e-4, clip_eps=0.2, prompts=live, harness_mode=hsa")
    args = parse_stage_args(parser, argv)
    config = opd_preset(args.preset)
    if args.steps is not None:
        config = with_steps(config, args.steps)
    changes = {"init": str(Path(args.init).resolve())}
    if args.teacher is not None:
        changes["teacher"] = str(Path(args.teacher).resolve())
    if args.loss is not None:
        changes["loss"] = args.loss
    config = apply_opd_overrides(dataclasses.replace(config, **changes), args.set)
    return finish_main(args, run_opd(config, args.out, **run_options(args)))


if __name__ == "__main__":
    cli(main)
