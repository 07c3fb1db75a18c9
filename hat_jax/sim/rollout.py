"""Rollouts of a policy in the live-stream environment, and rejection sampling over them.

`rollout` runs one episode: `env.reset(task, harness, seed)`, then `policy.act` / `env.step` until
the environment says done. `rejection_sample` is the SFT data step of HAT (the HAT report, arXiv
2608.15763 (TaoLive, 2026), "Training, three stages", stage 1, HSA-SFT): roll
the teacher out on each task, judge the episode, keep those the keep-rule accepts (by default
Accuracy == 1 and Effectiveness == 1), retrying a rejected task up to `attempts` times with a
re-seeded policy (`SeedablePolicy.with_seed`) so that attempts differ.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from hat_jax.harness.state import HarnessState
from hat_jax.sim.policy import Policy
from hat_jax.sim.types import Episode, Task

MAX_TURNS = 32  # hard stop for an environment that never says done (a bug, not a policy failure)


class RolloutError(RuntimeError):
    """A rollout could not finish: the policy raised, or the environment never ended the episode."""


def rollout(env: Any, policy: Policy, task: Task, harness: HarnessState, seed: int | None = None) -> Episode:
    """Runs one episode of `policy` on `task` under `harness`.

    Args:
      env: a `hat_jax.sim.env.LiveStreamEnv` (anything with reset/step/episode).
      policy: writes the assistant turns (`Policy.act`).
      task: the viewer request.
      harness: the harness the episode runs under.
      seed: passed to `env.reset` (fault injection); None lets the env derive it from the task.
    Returns:
      `env.episode()` once a step returns done.
    Raises:
      RolloutError: the policy raised (message names the task, turn and the original error; the
        original is chained), or the episode did not end within `MAX_TURNS` assistant turns.
    """
    messages = list(env.reset(task, harness, seed=seed))
    for turn in range(1, MAX_TURNS + 1):
        try:
            message = policy.act(list(messages), harness, task)
        except Exception as exc:
            raise RolloutError(
                f"task {task.task_id} ({task.intent}), turn {turn}: {type(policy).__name__}.act raised "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        result = env.step(message)
        messages.append(getattr(result, "assistant", None) or message)  # the turn as the env recorded it
        messages.extend(result.new_messages)
        if result.done:
            return env.episode()
    raise RolloutError(f"task {task.task_id}: the environment did not end the episode within {MAX_TURNS} turns")


@dataclasses.dataclass(frozen=True)
class RejectionStats:
    """What rejection sampling kept and rejected.

    Attributes:
      n_tasks: tasks tried.
      n_attempts: episodes rolled out (>= n_tasks).
      n_kept: episodes kept (at most one per task).
      rejection_rate: rejected attempts / attempts.
      kept_by_intent, tried_by_intent: task counts per intent (kept at some attempt / tried).
      first_attempt_rejection_rate: share of tasks whose first attempt was rejected.
      reject_reasons: for each rejected attempt, the judgement fields that failed the rule
        (`reasons(j)`), counted.
    """

    n_tasks: int
    n_attempts: int
    n_kept: int
    rejection_rate: float
    first_attempt_rejection_rate: float
    kept_by_intent: dict[str, int]
    tried_by_intent: dict[str, int]
    reject_reasons: dict[str, int]


def default_keep(judgement: Any) -> bool:
    """The paper's rule: keep an episode judged fully correct (Accuracy 1 and Effectiveness 1)."""
    return judgement.accuracy == 1 and judgement.effectiveness == 1


def _reasons(judgement: Any) -> list[str]:
    """Which of accuracy/effectiveness fell short (for the stats); 'other' when the keep-rule is custom."""
    out = [f for f in ("accuracy", "effectiveness") if getattr(judgement, f, 1) != 1]
    return out or ["other"]


def rejection_sample(
    env: Any,
    policy: Policy,
    tasks: Iterable[Task],
    harness: HarnessState,
    judge: Callable[[Episode], Any],
    *,
    keep: Callable[[Any], bool] = default_keep,
    attempts: int = 1,
    seed: int = 0,
) -> tuple[list[Episode], RejectionStats]:
    """Rolls `policy` out on each task and keeps the episodes `keep(judge(episode))` accepts.

    Args:
      env, policy, harness: as in `rollout`.
      tasks: the tasks, each tried until one attempt is kept or `attempts` are used.
      judge: episode -> judgement (e.g. `functools.partial(judge_episode, harness=h)`).
      keep: judgement -> bool.
      attempts: tries per task (>= 1). Attempt k > 0 uses `policy.with_seed(seed * 1000 + k)` when
        the policy has `with_seed` (an oracle or a seeded server); otherwise the same policy.
      seed: the rollout seed base; attempt k of a task runs `env.reset(..., seed=task.seed + k)`
        for k > 0 and the env's own per-task seed (None) for k == 0.
    Returns:
      (kept episodes in task order, stats).
    Raises:
      ValueError: attempts < 1.
      RolloutError: from `rollout`.
    """
    if attempts < 1:
        raise ValueError(f"attempts: expected >= 1, got {attempts}")
    kept: list[Episode] = []
    n_tasks = n_attempts = first_rejected = 0
    kept_by_intent: Counter[str] = Counter()
    tried_by_intent: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    for task in tasks:
        n_tasks += 1
        tried_by_intent[task.intent] += 1
        for k in range(attempts):
            pol = policy.with_seed(seed * 1000 + k) if k > 0 and hasattr(policy, "with_seed") else policy
            episode = rollout(env, pol, task, harness, seed=None if k == 0 else task.seed + k)
            n_attempts += 1
            judgement = judge(episode)
            if keep(judgement):
                kept.append(episode)
                kept_by_intent[task.intent] += 1
                break
            first_rejected += k == 0
            reasons.update(_reasons(judgement))
    stats = RejectionStats(
        n_tasks=n_tasks,
        n_attempts=n_attempts,
        n_kept=len(kept),
        rejection_rate=(n_attempts - len(kept)) / max(n_attempts, 1),
        first_attempt_rejection_rate=first_rejected / max(n_tasks, 1),
        kept_by_intent=dict(kept_by_intent),
        tried_by_intent=dict(tried_by_intent),
        reject_reasons=dict(reasons),
    )
    return kept, stats
