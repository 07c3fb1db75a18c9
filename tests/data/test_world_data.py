"""World datasets: rejection-sampled SFT records, RL tasks and eval items, cached by config hash."""

import dataclasses
import json
import re

import pytest

from hat_jax.data import world_data
from hat_jax.data.pipeline import RECORD_KEYS, SFTDataConfig, hsa_dataset
from hat_jax.harness.writer import dump_harness
from hat_jax.sim.world_harness import production_harness, world_harness

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
    assert meta["from_cache"] is False and meta2["from_cache"] is True
    assert again == records and {**meta2, "from_cache": False} == meta
    assert all((p.stat().st_mode & 0o777) == 0o644 for p in tmp_path.iterdir())  # readable by others
    # The records feed the Grain pipeline's HSA step as they are.
    out = list(hsa_dataset(records[:8], {"production": production_harness()}, SFTDataConfig(batch_size=2, p_hsa=1.0)))
    assert len(out) == 8 and all(o["hsa_applied"].any() for o in out)


def test_harness_that_fails_validation_is_refused(tmp_path):
    manifest = dump_harness(world_harness("compact"), tmp_path / "h")  # the path of its harness.yaml
    manifest.write_text(manifest.read_text(encoding="utf-8").replace("description_first", "sideways"), encoding="utf-8")
    with pytest.raises(ValueError, match=r"WorldDataConfig.harness = '.*h': .*harness.yaml: skill_listing: expected one "
                                         r"of name_first, description_first, got 'sideways'"):
        world_data.WorldDataConfig(harness=str(manifest.parent))


def test_records_follow_the_worlds_harness(tmp_path):
    """Records of the compact world are written under it (its system prompt, its harness id); the cache key
    follows the harness's name and its files."""
    compact = dataclasses.replace(SMALL, sft_tasks=6, harness="compact")
    assert compact.digest("sft") != dataclasses.replace(compact, harness="production").digest("sft")
    records, _ = world_data.sft_records(compact, cache_dir=tmp_path)
    assert records and {r["harness_id"] for r in records} == {"compact"}
    assert all("-> product-qa" in r["messages"][0]["content"] for r in records)
    skill_turns = [m["reasoning_content"] for r in records for m in r["messages"]
                   if m["role"] == "assistant" and "先加载" in (m.get("reasoning_content") or "")]
    assert skill_turns and all(re.fullmatch(r"观众在问.+，(先加载技能|先加载|需要先加载技能)[a-z-]+。", t)
                               for t in skill_turns)


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
    for field, value, expected in [
        ("sft_attempts", 0, "WorldDataConfig.sft_attempts = 0: expected an int >= 1"),
        ("sft_tasks", -1, "WorldDataConfig.sft_tasks = -1: expected an int >= 0"),
        ("sft_tasks", 2.5, "WorldDataConfig.sft_tasks = 2.5: expected an int >= 0"),
        ("rl_tasks", "10", "WorldDataConfig.rl_tasks = '10': expected an int >= 0"),
        ("n_products", 3, r"WorldDataConfig.n_products = 3: expected an int in \[10, 2000\]"),
        ("world_seed", None, "WorldDataConfig.world_seed = None: expected an int"),
        ("sft_fault_rates", {"error": float("nan")}, r"WorldDataConfig.sft_fault_rates\['error'\] = nan"),
        ("oracle", {}, "WorldDataConfig.oracle: expected an OracleConfig"),
        ("harness", "", "WorldDataConfig.harness = '': expected a harness name or folder path"),
        ("harness", "nope", r"WorldDataConfig.harness = 'nope': harness 'nope': expected a shipped harness"),
    ]:
        with pytest.raises(ValueError, match=expected):
            world_data.WorldDataConfig(**{field: value})


@pytest.mark.parametrize(
    "case, corrupt, problem",
    [
        ("non-utf8", lambda p, m: p.write_bytes(p.read_bytes()[:40] + b"\xff\xfe" + p.read_bytes()[40:]), "unreadable"),
        ("meta a list", lambda p, m: m.write_text("[1, 2]"), "is a JSON list, not an object"),
        ("empty object line", lambda p, m: _replace_line(p, 0, "{}"), "line 1 is not a valid rl record"),
        ("list line", lambda p, m: _replace_line(p, 1, "[]"), "line 2 is not a valid rl record"),
        ("NaN line", lambda p, m: _replace_line(p, 2, "NaN"), "line 3 is not a valid rl record"),
        ("dropped field", lambda p, m: _drop_field(p, 3, "gold_calls"), "line 4 is not a valid rl record"),
    ],
)
def test_untrustworthy_cache_files_are_reported_and_rebuilt(tmp_path, caplog, case, corrupt, problem):
    config = dataclasses.replace(SMALL, rl_tasks=5)
    tasks = world_data.rl_tasks(config, cache_dir=tmp_path)
    path = next(tmp_path.glob("rl-*.jsonl"))
    corrupt(path, world_data._meta_path(path))
    with caplog.at_level("WARNING", logger="hat_jax.data.world_data"):
        assert world_data.rl_tasks(config, cache_dir=tmp_path) == tasks
    assert str(path) in caplog.text and problem in caplog.text and "rebuilding it" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="hat_jax.data.world_data"):
        assert world_data.rl_tasks(config, cache_dir=tmp_path) == tasks  # the rebuilt file is trusted again
    assert not caplog.text


def test_sft_records_are_checked_on_read(tmp_path, caplog):
    records, _ = world_data.sft_records(dataclasses.replace(SMALL, sft_tasks=4), cache_dir=tmp_path)
    for r in records:
        world_data.check_sft_record(r)
    for bad, expected in [
        ({k: v for k, v in records[0].items() if k != "seed"}, "lacks ['seed']"),
        ({**records[0], "messages": []}, "'messages': expected a non-empty list"),
        ({**records[0], "messages": [{"content": "hi"}]}, "'messages[0]'"),
        ({**records[0], "seed": "7"}, "'seed': expected an int"),
        ({**records[0], "task": {**records[0]["task"], "intent": "dance"}}, "intent 'dance'"),
    ]:
        with pytest.raises(ValueError, match=re.escape(expected)):
            world_data.check_sft_record(bad)
    path = next(tmp_path.glob("sft-*.jsonl"))
    _drop_field(path, 0, "hook_retry_kept")
    with caplog.at_level("WARNING", logger="hat_jax.data.world_data"):
        again, meta = world_data.sft_records(dataclasses.replace(SMALL, sft_tasks=4), cache_dir=tmp_path)
    assert again == records and meta["from_cache"] is False and "line 1 is not a valid sft record" in caplog.text


def _replace_line(path, index, text):
    lines = path.read_text(encoding="utf-8").splitlines()
    lines[index] = text
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _drop_field(path, index, field):
    lines = path.read_text(encoding="utf-8").splitlines()
    record = json.loads(lines[index])
    del record[field]
    lines[index] = json.dumps(record, ensure_ascii=False)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
