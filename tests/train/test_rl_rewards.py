"""The RL step's reading metrics: each episode judged under its own task's harness, pooled over the step."""

import math
from types import SimpleNamespace

import numpy as np
import pytest

from hat_jax.harness.state import HarnessState, Skill, Tool
from hat_jax.sim.types import Episode, Task, ToolCallRecord
from hat_jax.train.rl_rewards import rollout_reading

OBJ = {"type": "object", "properties": {}}


def harness(price_tool: str) -> HarnessState:
    tools = (Tool("load", "load", OBJ, "load_skill"), Tool(price_tool, price_tool, OBJ, "get_price"))
    skills = (Skill("jiage-skill", "价格", "查价格", key="price_promotion"),)
    return HarnessState("t", "t-1", "load", skills, tools, ())


TASK = Task(task_id="t-1", seed=0, intent="price", message="这条裙子多少钱？", skill_key="price_promotion",
            product_ids=("P1",), gold_calls=((("get_price", {"product_id": "P1"}),),),
            gold_facts={"live_price": 199.0})


def call(name: str, impl: str, args: dict, status: str = "ok", result: dict | None = None) -> ToolCallRecord:
    return ToolCallRecord(round=1, name=name, impl=impl if status == "ok" else "", arguments=args,
                          canonical_args=args if status == "ok" else {}, status=status, result=result or {})


def episode(*calls: ToolCallRecord, skills=("jiage-skill",)) -> Episode:
    return Episode(task=TASK, harness_version="t-1", messages=({"role": "user", "content": TASK.message},),
                   tool_calls=calls, reply="到手价199元", loaded_skills=skills, outcome="replied")


LOAD = call("load", "load_skill", {"name": "jiage-skill"})


def test_each_episode_is_judged_under_its_groups_harness():
    # Group 0 runs the original harness (price tool "jiage"), group 1 a renamed one ("chaxun-jiage").
    harnesses = [harness("jiage"), harness("chaxun-jiage")]
    price = {"product_id": "P1", "live_price": 199.0}
    reads = episode(LOAD, call("jiage", "get_price", {"product_id": "P1"}, result=price))
    memorised = episode(LOAD, call("jiage", "", {"product_id": "P1"}, status="unknown_tool"))
    silent = episode(skills=())
    renamed = episode(LOAD, call("chaxun-jiage", "get_price", {"product_id": "P1"}, result=price))
    rollout = SimpleNamespace(episodes=[reads, silent, memorised, renamed], group_ids=np.array([0, 0, 1, 1]))
    m = rollout_reading(rollout, harnesses)
    # 6 calls, 5 with a name of their episode's harness; skill first in 3 of 4; the chain in 2 of 4; the price
    # returned in 2 of 4 and stated in both; no reply accurate without the price (the other two state 199
    # ungrounded)
    assert m == pytest.approx({"rollout/name_valid": 500 / 6, "rollout/skill_acc": 75.0,
                               "rollout/chain_done": 50.0, "rollout/fact_fetched": 50.0, "rollout/relayed": 100.0,
                               "rollout/abstained": 0.0, "rollout/calls_per_ep": 1.5})
    # The same episodes all judged under the renamed harness: "jiage" is then invalid in both episodes that call
    # it; the chain is what the calls did (their impls), so it does not change
    renamed_only = rollout_reading(SimpleNamespace(episodes=rollout.episodes, group_ids=np.ones(4, int)), harnesses)
    assert renamed_only["rollout/name_valid"] == pytest.approx(400 / 6)
    assert renamed_only["rollout/chain_done"] == 50.0


def test_a_step_without_calls_logs_nan_validity():
    m = rollout_reading(SimpleNamespace(episodes=[episode(skills=())] * 2, group_ids=np.zeros(2, int)),
                        [harness("jiage")])
    assert math.isnan(m["rollout/name_valid"]) and math.isnan(m["rollout/relayed"])  # no calls, nothing fetched
    assert (m["rollout/fact_fetched"], m["rollout/abstained"]) == (0.0, 0.0)
    assert (m["rollout/calls_per_ep"], m["rollout/skill_acc"], m["rollout/chain_done"]) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="no episodes"):
        rollout_reading(SimpleNamespace(episodes=[], group_ids=np.zeros(0, int)), [harness("jiage")])
