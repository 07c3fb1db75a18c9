"""Round trips of the world's record types through JSON."""

import json

import pytest

from hat_jax.sim import types


def _task() -> types.Task:
    return types.Task(
        task_id="live-000001",
        seed=7,
        intent="comparison",
        message="这两款哪个便宜？",
        skill_key="product_qa",
        product_ids=("P0001", "P0002"),
        gold_calls=((("search_products", {"query": "羊毛衫"}),), (("get_price", {"product_id": "P0001"}), ("get_price", {"product_id": "P0002"}))),
        gold_facts={"cheaper": "P0002", "live_price": 99.5},
        slots={"region": "浙江"},
    )


def test_task_round_trip_through_json():
    task = _task()
    assert types.task_from_dict(json.loads(json.dumps(types.task_to_dict(task), ensure_ascii=False))) == task


def test_episode_round_trip_through_json():
    call = types.ToolCallRecord(
        round=1, name="get_price", impl="get_price", arguments={"product_id": "P0001"},
        canonical_args={"product_id": "P0001"}, status="ok", result={"live_price": 99.5}, latency_s=0.01,
    )
    episode = types.Episode(
        task=_task(), harness_version="2026.11.0",
        messages=({"role": "user", "content": "这两款哪个便宜？"},), tool_calls=(call,), reply="宝宝，第二款便宜",
        loaded_skills=("product-qa",), hook_events=(("Stop", "reply_length_limit", "ok"),), seed=123,
    )
    restored = types.episode_from_dict(json.loads(json.dumps(types.episode_to_dict(episode))))
    assert restored == episode


def test_bad_records_name_the_field():
    data = types.task_to_dict(_task())
    with pytest.raises(ValueError, match="intent 'haggle'"):
        types.task_from_dict({**data, "intent": "haggle"})
    with pytest.raises(ValueError, match="lacks \\['message'\\]"):
        types.task_from_dict({k: v for k, v in data.items() if k != "message"})
