"""`rollout` and `rejection_sample`: exact stats with stub judges, errors, the noisy oracle's rejection rate."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest

from hat_jax.judges.rules import judge_episode
from hat_jax.sim.env import LiveStreamEnv
from hat_jax.sim.oracle import DEFAULT_NOISE, OracleTeacher
from hat_jax.sim.rollout import RolloutError, rejection_sample, rollout
from hat_jax.sim.viewers import sample_tasks


@pytest.fixture(scope="module")
def tasks(world):
    return sample_tasks(world, 3, seed=5)


def test_rollout_returns_the_env_episode(world, harness, tasks):
    env = LiveStreamEnv(world)
    ep = rollout(env, OracleTeacher(world), tasks[0], harness, seed=3)
    assert ep == env.episode() and ep.outcome == "replied" and ep.task is tasks[0]
    assert ep.messages[-1] == {"role": "assistant", "content": ep.reply, "reasoning_content": ep.messages[-1]["reasoning_content"]}


def test_a_policy_exception_names_the_task(world, harness, tasks):
    class Broken:
        def act(self, messages, harness, task):
            raise KeyError("boom")

    with pytest.raises(RolloutError, match=rf"task {tasks[0].task_id} \({tasks[0].intent}\), turn 1: Broken.act raised KeyError") as info:
        rollout(LiveStreamEnv(world), Broken(), tasks[0], harness)
    assert isinstance(info.value.__cause__, KeyError)


def test_an_env_that_never_ends_is_an_error(harness, tasks):
    class Endless:
        def reset(self, task, harness, seed=None):
            return [{"role": "user", "content": "x"}]

        def step(self, message):
            return SimpleNamespace(new_messages=[], done=False, assistant=message)

    policy = SimpleNamespace(act=lambda m, h, t: {"role": "assistant", "content": "", "tool_calls": []})
    with pytest.raises(RolloutError, match="did not end the episode within 32 turns"):
        rollout(Endless(), policy, tasks[0], harness)


def test_rejection_sample_counts_exactly(world, harness, tasks):
    seen = []

    def judge(ep):  # rejects the first attempt of every task
        seen.append(ep.task.task_id)
        ok = seen.count(ep.task.task_id) > 1
        return SimpleNamespace(accuracy=1 if ok else 0, effectiveness=1.0)

    kept, stats = rejection_sample(LiveStreamEnv(world), OracleTeacher(world), tasks, harness, judge, attempts=2)
    assert [e.task.task_id for e in kept] == [t.task_id for t in tasks]
    assert (stats.n_tasks, stats.n_attempts, stats.n_kept) == (3, 6, 3)
    assert (stats.rejection_rate, stats.first_attempt_rejection_rate) == (0.5, 1.0)
    assert stats.reject_reasons == {"accuracy": 3}
    kept, stats = rejection_sample(LiveStreamEnv(world), OracleTeacher(world), tasks, harness,
                                   lambda ep: SimpleNamespace(accuracy=1, effectiveness=0.5), attempts=2)  # fmt: skip
    assert (kept, stats.n_attempts, stats.rejection_rate, stats.reject_reasons) == ([], 6, 1.0, {"effectiveness": 6})
    with pytest.raises(ValueError, match="attempts"):
        rejection_sample(LiveStreamEnv(world), OracleTeacher(world), tasks, harness, judge, attempts=0)


def test_noisy_oracle_rejection_rate_and_retries(world, harness):
    many = sample_tasks(world, 300, seed=21)
    judge = functools.partial(judge_episode, harness=harness)
    kept, stats = rejection_sample(LiveStreamEnv(world), OracleTeacher(world), many, harness, judge)
    assert stats.rejection_rate == 0.0 and len(kept) == 300
    kept, stats = rejection_sample(LiveStreamEnv(world), OracleTeacher(world, DEFAULT_NOISE), many, harness, judge)
    assert 0.05 < stats.rejection_rate < 0.3, stats
    assert all(judge(e).accuracy == 1 and judge(e).effectiveness == 1 for e in kept)
    kept3, stats3 = rejection_sample(LiveStreamEnv(world), OracleTeacher(world, DEFAULT_NOISE), many, harness, judge, attempts=3)
    assert len(kept3) > len(kept) and stats3.n_attempts > 300  # re-seeded attempts make other mistakes
