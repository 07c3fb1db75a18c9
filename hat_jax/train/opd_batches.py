"""The OPD stage's batch sources (`hat_jax.train.opd`): the prompt pools, the per-step draws and `OPDBatches`,
the callable batch source of `hat_jax.train.trainer.run_stage` that samples with the current student and adds
the frozen teacher's columns; for "live", the live-stream episodes and their rollout / judge-reward metrics.

One step, prompts "general"/"tulu":
1. prompts: `prompts_per_step` drawn without replacement from the pool by np.random.default_rng((seed,
   step)); the pool is `general_prompts(prompt_pool, seed, "train")` (IFEval-style, "general") or
   `load_tulu_prompts(prompt_pool, seed, source=tulu_path)` ("tulu"; a local copy, the hub is offline), with
   prompts longer than seq_len - max_new_tokens tokens dropped. Each is [{"role": "user", "content": p}],
   rendered by the tokenizer's chat template with the generation prompt (thinking on: `<think>\\n`), no tools.
2. sampling: `sample_completions` with the *current* student params, `samples_per_prompt` per prompt,
   rng = fold_in(fold_in(key(seed), 2), step): a resumed run samples exactly what the killed one did.
   Rows are right-padded to seq_len (one training shape, one compilation; padding costs compute), or with
   `train_bucket` set to a multiple of it (at most seq_len).
3. teacher: `hat_jax.train.opd_loss.make_teacher_fn` over the sampled rows, outside the gradient, one
   micro-batch at a time: teacher token logprobs [B, T] and, for "exact", its final hidden states [B, T, H_T].

prompts "live" (Table 5 of the HAT report, arXiv 2608.15763 (TaoLive, 2026): RL versus distillation from a
strong teacher in the same environment, from the same checkpoint). Steps 1-2 become the RL stage's rollout
(`hat_jax.train.rl`, with the same draws: `draw_task_indices` / `draw_harnesses` are shared, so with equal seed,
world and counts both arms see the same tasks and harness variants at each step): `prompts_per_step` distinct
tasks of `rl_tasks(world)` drawn by (seed, step); harness `harness_mode` = "original" (the production harness)
or "hsa" (`compose(production, Random(s), hsa, "train")`, s from (seed, step, task index)); `rollout_episodes`
with the current student params, `samples_per_prompt` episodes per task, at most `max_turns` model turns of
`max_new_tokens` each, `env` (tool rounds, faults), sequences capped at seq_len, rng `sampling_key`. The
sequence of an episode is prompt + sampled + environment (tool responses, hook feedback, next generation
prompt) + sampled ... tokens; the action mask is 1 exactly on the sampled tokens, so the environment's
tokens are context for both models and never trained on. Step 3 is unchanged: the teacher forwards the whole
sequences and only the action positions enter the loss. Why on-policy episodes rather than teacher episodes:
GKD's lambda = 1 (Agarwal et al. 2024, arXiv 2306.13649; the student's own states, including the environment's
answers to its own tool calls), which is what RL trains on too, so the two arms differ only in the learning
signal (teacher KL vs judge rewards). The judges (`hat_jax.train.rl_rewards.judge_rewards`, `reward` = RL's
CoT-penalty shape) score the sampled episodes for the metrics only (`live_metrics`); they do not enter the
loss. `enable_thinking` must stay True (the harness renders the prompt; thinking is always on).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from hat_jax.judges.rewards import COMPONENTS, RewardConfig, weighted_reward
from hat_jax.model.params import COMPUTE_DTYPES
from hat_jax.model.sampling import SamplingConfig
from hat_jax.rollout import RolloutConfig, rollout_episodes, sample_completions
from hat_jax.rollout.sampler import round_up
from hat_jax.tokenizer import chat_encoding
from hat_jax.train.opd_loss import make_teacher_fn
from hat_jax.train.policy_packing import packed_update
from hat_jax.train.rl import draw_harnesses, draw_task_indices
from hat_jax.train.rl_rewards import OUTCOMES, judge_rewards, rollout_reading
from hat_jax.train.stage import stage_sampler
from hat_jax.train.trainer import TrainState

if TYPE_CHECKING:
    from hat_jax.train.opd_config import OPDConfig

log = logging.getLogger(__name__)
# The host batch's arrays that the train step takes, split into micro-batches (`OPDBatches`).
SAMPLED_KEYS = ("input_ids", "attention_mask", "action_mask", "old_logprobs", "teacher_logprobs")
EXACT_KEYS = SAMPLED_KEYS + ("teacher_hidden",)


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
        n = len(chat_encoding(tokenizer, messages, add_generation_prompt=True, **kwargs).ids)
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
        than max_new_tokens below seq_len (names both and the scales' live sections; HSA prompts are longer still).
    """
    from hat_jax.data.world_data import rl_tasks, world_for
    from hat_jax.harness.render import render_ids
    from hat_jax.sim.env import LiveStreamEnv
    from hat_jax.sim.world_harness import world_harness

    tasks = rl_tasks(config.world)
    if len(tasks) < config.prompts_per_step:
        raise ValueError(f"OPDConfig.prompts_per_step = {config.prompts_per_step} but world.rl_tasks gives only "
                         f"{len(tasks)} tasks")
    world, production = world_for(config.world.world_seed, config.world.n_products), world_harness(config.world.harness)
    messages = LiveStreamEnv(world, config.env).reset(tasks[0], production)
    n = len(render_ids(tokenizer, production, messages, add_generation_prompt=True))
    if n + config.max_new_tokens > config.seq_len:
        raise ValueError(f"OPDConfig.seq_len = {config.seq_len}: a live-stream prompt has {n} tokens under the "
                         f"production harness (more under HSA), no room for max_new_tokens = {config.max_new_tokens}; "
                         f"raise seq_len (--set seq_len=...) or use a scale's live section (opd_live: --live)")
    return LiveTasks(tuple(tasks), world, production)


def live_metrics(rollout, components: dict[str, np.ndarray], counts: list[list[int]],
                 reward: RewardConfig) -> dict[str, float]:
    """The "live" step's rollout and judge-reward scalars (the RL stage's tags; `hat_jax.train.opd` docstring).

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
      teacher_model: the teacher's module.
      sampler: the student's sampler, given each step's params by `with_params` (default: a `JaxSampler` of
        the student in the stage's compute dtype with its bucket).
      batch_ways: how many ways the mesh splits a micro-batch's rows (`hat_jax.train.trainer.batch_ways`).

    With config.pack_rows the arrays are packed after the teacher's forward (`hat_jax.train.policy_packing`:
    segment_ids, loss_weights, loss_counts in place of attention_mask) where that saves rows.
    """

    def __init__(self, config: OPDConfig, model_config, tokenizer, pool, teacher_params, teacher_model,
                 sampler=None, batch_ways: int = 1):
        self.config, self.model_config, self.tokenizer, self.pool = config, model_config, tokenizer, pool
        self.batch_ways = batch_ways  # packed rows: whole micro-batches of rows that split this many ways
        self.teacher_params, self.teacher_fn = teacher_params, make_teacher_fn(teacher_model, config)
        self.sampling = SamplingConfig(temperature=config.temperature, top_p=config.top_p,
                                       max_new_tokens=config.max_new_tokens)
        self.sampler = sampler if sampler is not None else stage_sampler(
            config, model_config, tokenizer, COMPUTE_DTYPES[config.compute_dtype], config.bucket)

    def _completions(self, params, step: int) -> tuple[dict, dict]:
        c = self.config
        prompts = [self.pool[i] for i in step_prompt_ids(c, len(self.pool), step)]
        t0 = time.perf_counter()
        rows = sample_completions(self.sampler.with_params(params), prompts, self.sampling, sampling_key(c, step),
                                  c.samples_per_prompt, c.seq_len,
                                  template_kwargs=None if c.enable_thinking else {"enable_thinking": False})
        dt = time.perf_counter() - t0
        comp = rows["completion_lengths"]
        return rows, {"rollout/completion_len": float(np.mean(comp)),
                      "rollout/finished_frac": float(np.mean(rows["finished"])),
                      "rollout/gen_tokens_per_s": float(np.sum(comp)) / max(dt, 1e-9), "time/generation_s": dt}

    def _episodes(self, params, step: int) -> tuple[dict, dict]:
        c, pool = self.config, self.pool
        tasks = [pool.tasks[i] for i in draw_task_indices(len(pool.tasks), c.prompts_per_step, c.seed, step)]
        harnesses = draw_harnesses(pool.production, c.harness_mode, c.hsa, c.seed, step, len(tasks))
        t0 = time.perf_counter()
        settings = RolloutConfig(self.sampling, group_size=c.samples_per_prompt, max_turns=c.max_turns,
                                 seq_len=c.seq_len, env=c.env)
        rollout = rollout_episodes(self.sampler.with_params(params), pool.world, tasks, harnesses,
                                   sampling_key(c, step), settings)
        t1 = time.perf_counter()
        components, counts = judge_rewards(rollout, harnesses, self.tokenizer, c.reward)
        stats = live_metrics(rollout, components, counts, c.reward)
        stats.update(rollout_reading(rollout, harnesses))
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
        arrays = {k: batch.pop(k) for k in EXACT_KEYS if k in batch}
        arrays, rows = packed_update(arrays, pack=c.pack_rows, aggregation=c.aggregation, max_len=c.max_len,
                                     rows_multiple=c.accum_steps * self.batch_ways)
        batch.update(arrays)
        stats.update(rows)
        batch["stats"] = {**stats, "time/teacher_s": time.perf_counter() - t1}
        return batch
