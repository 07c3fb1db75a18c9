"""Host side of one HSA-RL step after the rollouts: judge rewards, reasoning-token counts, advantages, the
invalid-sample drop, the padded host batch and the step's reward / advantage / rollout metrics.

What each piece implements is described in `hat_jax.train.rl`'s module docstring (steps 3 and 4, and the
metric list); the math is `hat_jax.train.advantages` (GRPO / GDPO / Dr.GRPO) and `hat_jax.judges.rewards`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from hat_jax.judges.reading import episode_reading, reading_scores
from hat_jax.judges.rewards import COMPONENTS, RewardConfig, reward_components
from hat_jax.judges.rules import judge_episode
from hat_jax.model.sharding import host_values
from hat_jax.rollout.episodes import pack_expert_ids
from hat_jax.rollout.sampler import round_up
from hat_jax.rollout.turns import reasoning_tokens
from hat_jax.train.advantages import get_advantage_estimator, group_normalise

OUTCOMES = ("replied", "no_reply", "round_limit", "malformed", "truncated")  # `hat_jax.sim.types.Episode.outcome`
# What an RL or live OPD step's progress bar and log line show beside the loss (`LoopConfig.shown`): the reward, the
# two judge rewards whose split tells abstaining (accuracy up, effectiveness flat) from learning, and the calls.
SHOWN = ("reward/total", "reward/accuracy", "reward/effectiveness", "rollout/calls_per_ep", "rollout/name_valid",
         "rollout/abstained")


def judge_rewards(rollout, harnesses: Sequence[Any], tokenizer: Any,
                  config: RewardConfig) -> tuple[dict[str, np.ndarray], list[list[int]]]:
    """Judges every episode under its task's harness and returns its reward components.

    Args:
        rollout: a `RolloutBatch` (group_ids index `harnesses`). harnesses: one per task.
        tokenizer: counts reasoning tokens (`hat_jax.rollout.turns.reasoning_tokens`). config: the CoT penalty shape.
    Returns:
        ({component: float32 [N]} in `COMPONENTS` order, reasoning tokens per sampled turn of each episode).
    """
    comps = {k: np.zeros(len(rollout.episodes), np.float32) for k in COMPONENTS}
    counts = []
    for n, episode in enumerate(rollout.episodes):
        harness = harnesses[int(rollout.group_ids[n])]
        turns = [reasoning_tokens(tokenizer, text) for text in rollout.turn_texts[n]]
        values = reward_components(judge_episode(episode, harness), turns, config)
        for k in COMPONENTS:
            comps[k][n] = values[k]
        counts.append(turns)
    return comps, counts


def rollout_reading(rollout, harnesses: Sequence[Any]) -> dict[str, float]:
    """The step's reading metrics (`hat_jax.judges.reading`), each episode judged under its task's harness.

    A policy that stops calling tools, or calls names its harness lacks, shows here at the step it happens,
    while its Accuracy reward may still rise (short replies that state no fact).

    Args:
        rollout: a `RolloutBatch` (group_ids index `harnesses`). harnesses: one per task.
    Returns:
        {"rollout/calls_per_ep": tool calls per episode (a count), "rollout/name_valid": % of the calls whose
        name the harness has, "rollout/skill_acc": % of the episodes with Skill Selection 1,
        "rollout/chain_done": % of the episodes with gold calls that made them in order, "rollout/fact_fetched",
        "rollout/relayed", "rollout/abstained": as `hat_jax.judges.reading`}; NaN where `reading_scores` is
        undefined (no calls, no skill, gold calls or checkable fact to judge, nothing fetched).
    Raises:
        ValueError: no episodes.
    """
    readings = [episode_reading(e, harnesses[int(rollout.group_ids[n])]) for n, e in enumerate(rollout.episodes)]
    return {f"rollout/{k}": float("nan") if v is None else float(v) for k, v in reading_scores(readings).items()}


def _pad(x: np.ndarray, t: int, value) -> np.ndarray:
    if x.shape[1] == t:
        return x
    out = np.full((x.shape[0], t) + x.shape[2:], value, x.dtype)
    out[:, :x.shape[1]] = x
    return out


def _mean(x: np.ndarray) -> float:
    return float(np.mean(x)) if x.size else float("nan")


def _norm_std(x: np.ndarray, valid: np.ndarray, group_ids: np.ndarray, eps) -> float:
    z = np.asarray(group_normalise(jnp.asarray(np.where(valid, x, 0.0), jnp.float32), jnp.asarray(valid),
                                   jnp.asarray(group_ids), eps))
    return float(np.std(z[valid])) if valid.any() else float("nan")


def host_batch(rollout, components: Mapping[str, np.ndarray], counts: Sequence[Sequence[int]], config, *,
               pad_id: int = 0, ref_fn: Callable | None = None, ref_params=None) -> tuple[dict, dict[str, float]]:
    """The update's host batch and the step's metrics (`hat_jax.train.rl` module docstring).

    Args:
        rollout: the step's `RolloutBatch` [N, T]. components: {name: [N]} (NaN/inf allowed: dropped samples).
        counts: reasoning tokens per turn of each episode. config: the `RLConfig`.
        pad_id: input_ids padding. ref_fn, ref_params: `make_ref_logprobs` and the frozen reference (beta > 0).
    Returns:
        (batch, metrics): batch has input_ids, attention_mask, action_mask (x valid), old_logprobs [N, T'],
        advantages [N] float32, ref_logprobs [N, T'] (with ref_fn), expert_ids [N, L, ceil(k/2), T'] int32 (routing replay, `pack_expert_ids`);
        T' = T rounded up to config.train_bucket (at most config.seq_len).
    """
    n_rows, t = rollout.input_ids.shape
    gid = np.asarray(rollout.group_ids)
    weights = [float(config.reward.weights.get(k, 0.0)) for k in COMPONENTS]
    comps = {k: np.asarray(components[k], np.float32) for k in COMPONENTS}
    estimator = get_advantage_estimator(config.estimator)
    adv = estimator(comps, gid, weights)
    valid = np.asarray(adv.valid, bool)
    advantages = np.asarray(adv.advantages, np.float32)

    t_train = max(t, min(round_up(t, config.train_bucket), config.seq_len))
    batch = {
        "input_ids": _pad(rollout.input_ids, t_train, pad_id),
        "attention_mask": _pad(rollout.attention_mask, t_train, 0),
        "action_mask": _pad(rollout.action_mask * valid[:, None].astype(np.int32), t_train, 0),
        "old_logprobs": _pad(rollout.old_logprobs, t_train, 0.0),
        "advantages": advantages,
    }
    if config.routing_replay:
        ids = np.transpose(rollout.expert_ids, (1, 0, 2, 3))                         # [N, L, T, k]
        padded = np.array(np.broadcast_to(np.arange(ids.shape[-1], dtype=np.int32), ids.shape[:2] + (t_train, ids.shape[-1])))
        padded[:, :, :t] = ids
        batch["expert_ids"] = pack_expert_ids(padded)                                # [N, L, ceil(k/2), T]
    t_ref = 0.0
    if ref_fn is not None:
        t0 = time.perf_counter()
        rows = n_rows // (config.ppo_minibatches * config.accum_steps)
        parts = [np.asarray(host_values(ref_fn(ref_params, batch["input_ids"][i:i + rows],
                                               batch["attention_mask"][i:i + rows])))
                 for i in range(0, n_rows, rows)]
        batch["ref_logprobs"] = np.concatenate(parts).astype(np.float32)
        t_ref = time.perf_counter() - t0

    eps = estimator.eps  # the estimator's group normalisation (None: centring only)
    metrics: dict[str, float] = {}
    for k in COMPONENTS:
        metrics[f"reward/{k}"] = _mean(comps[k][valid])
        metrics[f"reward/{k}_norm"] = _norm_std(comps[k], valid, gid, eps)
    total = np.asarray(adv.rewards, np.float32)
    metrics["reward/total"] = _mean(total[valid])
    metrics["reward/total_norm"] = _norm_std(total, valid, gid, eps)
    a = advantages[valid]
    metrics.update({"adv/mean": _mean(a), "adv/std": float(np.std(a)) if a.size else float("nan"),
                    "adv/abs_max": float(np.max(np.abs(a))) if a.size else float("nan"),
                    "adv/zero_frac": _mean((a == 0).astype(np.float32)),
                    "data/invalid_samples": float(n_rows - valid.sum())})
    stats = rollout.stats
    turns = [c for episode in counts for c in episode]
    metrics.update({"rollout/reasoning_len": _mean(np.asarray(turns, np.float32)),
                    "rollout/tokens": float(stats["tokens_generated"]),
                    "rollout/tokens_per_s": float(stats["tokens_per_s"]),
                    "rollout/turns": float(stats["mean_turns"]),
                    "rollout/truncated_frac": float(stats["truncated"]) / n_rows,
                    "rollout/seq_len": _mean(np.asarray(stats["seq_lens"], np.float32)),
                    "time/ref_s": t_ref})
    outcomes = dict(stats["outcomes"])
    for name in sorted(set(OUTCOMES) | set(outcomes)):
        metrics[f"rollout/outcome_{name}"] = outcomes.get(name, 0) / n_rows
    return batch, metrics
