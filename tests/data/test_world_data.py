"""World datasets: rejection-sampled SFT records, RL tasks and eval items, cached by config hash."""

import dataclasses
import json

import pytest

from hat_jax.data import world_data
from hat_jax.data.pipeline import RECORD_KEYS, SFTDataConfig, hsa_dataset
from hat_jax.harness.loader import production_harness

SMALL = world_data.WorldDataConfig(sft_tasks=60, rl_tasks=40, eval_items=12)


def test_sft_records_are_rejection_sampled_and_cached(tmp_path):
    records, meta = world_data.sft_records(SMALL, cache_dir=tmp_path)
    stats = meta["stats"]
    assert meta["n_records"] == len(records) == stats["n_kept"] and stats["n_tasks"] == 60
    assert 0 < stats["rejection_rate"] < 0.5 and stats["n_attempts"] > 60
    assert len(records) >= 55  # two attempts per task
    for r in records:
        assert set(RECORD_KEYS) <= set(r) and r["harness_id"] == "production"
        assert r["messages"][0]["role"] == "system" and r["messages"][-1]["role"] == "assistant"
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 2 and not any(f.endswith(".partial") for f in files)
    # A second call reads the cache: same records, no rebuild.
    again, meta2 = world_data.sft_records(SMALL, cache_dir=tmp_path)
    assert again == records and meta2 == json.loads(json.dumps(meta))
    # The records feed the Grain pipeline's HSA step as they are.
    out = list(hsa_dataset(records[:8], {"production": production_harness()}, SFTDataConfig(batch_size=2, p_hsa=1.0)))
    assert len(out) == 8 and all(o["hsa_applied"].any() for o in out)


def test_cache_key_and_corrupt_cache(tmp_path, monkeypatch):
    assert SMALL.digest("sft") != dataclasses.replace(SMALL, sft_tasks=61).digest("sft")
    assert SMALL.digest("sft") != SMALL.digest("rl")
    tasks = world_data.rl_tasks(SMALL, cache_dir=tmp_path)
    assert len(tasks) == 40 and world_data.rl_tasks(SMALL, cache_dir=tmp_path) == tasks
    path = next(tmp_path.glob("rl-*.jsonl"))
    path.write_text(path.read_text()[:-30])  # a truncated file is rebuilt, not trusted
    assert world_data.rl_tasks(SMALL, cache_dir=tmp_path) == tasks
    calls = []
    monkeypatch.setattr(world_data, "sample_tasks", lambda *a, **k: calls.append(a) or [])
    assert world_data.rl_tasks(SMALL, cache_dir=tmp_path) == tasks and not calls  # served from the cache


def test_eval_items_are_disjoint_from_training(tmp_path):
    train = {r["task"]["message"] for r in world_data.sft_records(SMALL, cache_dir=tmp_path)[0]}
    train |= {t.message for t in world_data.rl_tasks(SMALL, cache_dir=tmp_path)}
    for suite in ("live_qa", "variant_qa", "tool_robustness", "prompt_robustness"):
        items = world_data.eval_items(suite, SMALL, cache_dir=tmp_path)
        assert len(items) == 12 and not {i.task.message for i in items} & train
        assert world_data.eval_items(suite, SMALL, cache_dir=tmp_path) == items
    with pytest.raises(ValueError, match="unknown 'qa'"):
        world_data.eval_items("qa", SMALL, cache_dir=tmp_path)


def test_config_validation():
    with pytest.raises(ValueError, match="sft_attempts"):
        world_data.WorldDataConfig(sft_attempts=0)
