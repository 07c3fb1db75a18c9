"""The judges on the real world: the ideal oracle under the production harness scores full marks."""

from hat_jax.judges.rules import METRICS, judge_episode
from hat_jax.sim.catalog import World
from hat_jax.sim.env import EnvConfig, LiveStreamEnv
from hat_jax.sim.oracle import OracleTeacher
from hat_jax.sim.rollout import rollout
from hat_jax.sim.types import INTENTS
from hat_jax.sim.viewers import sample_tasks
from hat_jax.sim.world_harness import production_harness


def test_ideal_oracle_gets_every_metric_on_every_intent():
    harness, world = production_harness(), World.generate(seed=0)
    tasks = sample_tasks(world, 78, seed=11)
    assert {t.intent for t in tasks} == set(INTENTS)
    env, oracle = LiveStreamEnv(world, EnvConfig()), OracleTeacher(world)
    for t in tasks:
        j = judge_episode(rollout(env, oracle, t, harness), harness)
        assert all(getattr(j, m) == 1 for m in METRICS) and j.severity == (), (t.intent, t.message, j.reasons)
