"""The SFT Grain pipeline with HSA (hat_jax.data.pipeline)."""

import json

import numpy as np
import pytest

from hat_jax.data import pipeline as P
from hat_jax.data.packing import DataStateFormatError
from hat_jax.harness import hsa
from hat_jax.harness.render import render_system_prompt, render_tokens
from hat_jax.sim.world_harness import production_harness
from hat_jax.tokenizer import train_bpe_tokenizer

H = production_harness()
HARNESSES = {"production": H}
QUESTIONS = ("这件卫衣M码黑色还有吗？多少钱？", "还有货吗？价格多少？", "黑色M码有没有？", "多少钱一件？")


def record(i: int, failed: bool = False) -> dict:
    price_result = {"error": "工具 get_price 超时"} if failed else {"product_id": f"P{i:04d}", "live_price": 100.0 + i}
    messages = [
        {"role": "system", "content": "old"},
        {"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "加载 price-promotion。",
            "tool_calls": [
                {"type": "function", "function": {"name": "load_skill", "arguments": {"skill": "price-promotion"}}}
            ],
        },
        {
            "role": "tool",
            "name": "load_skill",
            "content": json.dumps(
                {"skill": "price-promotion", "content": H.skill("price-promotion").body}, ensure_ascii=False
            ),
        },
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "查 get_stock 和 get_price。",
            "tool_calls": [
                {"type": "function", "function": {"name": "get_stock", "arguments": {"sku_id": f"P{i:04d}-黑-M"}}},
                {"type": "function", "function": {"name": "get_price", "arguments": {"product_id": f"P{i:04d}"}}},
            ],
        },
        {"role": "tool", "name": "get_stock", "content": json.dumps({"stock": i}, ensure_ascii=False)},
        {"role": "tool", "name": "get_price", "content": json.dumps(price_result, ensure_ascii=False)},
        {"role": "assistant", "content": f"宝宝，还有{i}件，直播价{100 + i}元。", "reasoning_content": "按结果回答。"},
    ]
    return {"messages": messages, "task_id": f"live-{i:06d}", "harness_id": "production", "seed": 1000 + i}


RECORDS = [record(i) for i in range(12)]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    texts = [render_system_prompt(H), json.dumps(H.openai_tools(), ensure_ascii=False)] * 3
    texts += [json.dumps(m, ensure_ascii=False) for r in RECORDS[:4] for m in r["messages"]]
    return train_bpe_tokenizer(texts, 700, tmp_path_factory.mktemp("tok"))


def cfg(**kw):
    """Unpacked unless pack=True is passed (the layout most tests below pin)."""
    base = dict(seq_len=4096, batch_size=4, seed=3, read_threads=1, prefetch=2, pack=False)
    return P.SFTDataConfig(**{**base, **kw})


def documents(batch: dict) -> list[tuple[list[int], list[int]]]:
    """The (ids, loss_mask) of each document of a packed batch, row by row."""
    out = []
    for row in range(batch["segment_ids"].shape[0]):
        seg = batch["segment_ids"][row]
        for d in range(1, int(seg.max()) + 1):
            out.append((batch["input_ids"][row][seg == d].tolist(), batch["loss_mask"][row][seg == d].tolist()))
    return out


def test_batches_shapes_masks_and_original_rows_exact(tok):
    config = cfg(p_hsa=0.0, shuffle=False)
    batches = list(P.sft_dataset(RECORDS, HARNESSES, tok, config))
    assert len(batches) == 3
    b = batches[0]
    assert {k: (v.shape, v.dtype) for k, v in b.items()} == {
        "input_ids": ((4, 4096), np.int32),
        "loss_mask": ((4, 4096), np.int32),
        "attention_mask": ((4, 4096), np.int32),
        "num_tokens": ((4,), np.int32),
        "truncated": ((4,), np.int8),
        "hsa_applied": ((4, len(hsa.transform_names())), np.int8),
    }
    ids, mask = render_tokens(tok, H, RECORDS[1]["messages"])
    n = len(ids)
    assert b["num_tokens"][1] == n < 4096
    np.testing.assert_array_equal(b["input_ids"][1, :n], ids)
    np.testing.assert_array_equal(b["loss_mask"][1, :n], mask)
    assert (b["input_ids"][1, n:] == tok.pad_token_id).all() and not b["loss_mask"][1, n:].any()
    assert b["attention_mask"][1].sum() == n and not b["hsa_applied"].any() and not b["truncated"].any()


def test_truncation_keeps_seq_len(tok):
    b = next(iter(P.sft_dataset(RECORDS, HARNESSES, tok, cfg(p_hsa=0.0, seq_len=64))))
    assert b["input_ids"].shape == (4, 64) and (b["num_tokens"] > 64).all() and b["attention_mask"].all()


def test_truncation_is_flagged_per_row_and_logged_once(tok, caplog):
    lengths = [len(render_tokens(tok, H, r["messages"])[0]) for r in RECORDS]
    prompt = min(len(render_tokens(tok, H, r["messages"][:2])[0]) for r in RECORDS)  # system + user: no loss token
    seq_len = sorted(lengths)[6]  # rows longer than the 7th shortest are cut
    with caplog.at_level("WARNING", logger="hat_jax.data.pipeline"):
        batches = list(P.sft_dataset(RECORDS, HARNESSES, tok, cfg(p_hsa=0.0, shuffle=False, seq_len=seq_len)))
    truncated = np.concatenate([b["truncated"] for b in batches])
    num_tokens = np.concatenate([b["num_tokens"] for b in batches])
    assert truncated.dtype == np.int8 and truncated.shape == (12,)
    np.testing.assert_array_equal(num_tokens, lengths)
    np.testing.assert_array_equal(truncated, [n > seq_len for n in lengths])
    assert truncated.sum() == sum(n > seq_len for n in lengths) > 0
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and f"> seq_len {seq_len}" in warnings[0] and "(1 of " in warnings[0]
    # cut before the first assistant token: the row trains nothing, which is logged too
    caplog.clear()
    with caplog.at_level("WARNING", logger="hat_jax.data.pipeline"):
        b = next(iter(P.sft_dataset(RECORDS, HARNESSES, tok, cfg(p_hsa=0.0, seq_len=prompt - 5))))
    assert b["truncated"].all() and not b["loss_mask"].any()
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2 and "has no loss token left" in warnings[1]


def test_hsa_records_are_consistent_and_deterministic():
    ds = P.hsa_dataset(RECORDS, HARNESSES, cfg(p_hsa=1.0))
    elems = [ds[i] for i in range(len(ds))]
    again = P.hsa_dataset(RECORDS, HARNESSES, cfg(p_hsa=1.0))
    assert [(e["harness"].version, e["messages"]) for e in elems] == [
        (e["harness"].version, e["messages"]) for e in again
    ]
    assert sorted(e["task_id"] for e in elems) == sorted(r["task_id"] for r in RECORDS)
    for e in elems:
        h = e["harness"]
        assert e["hsa_applied"].any() and h.family == "hsa-train"
        names = [c["function"]["name"] for m in e["messages"] for c in m.get("tool_calls") or []]
        assert [h.tool(n).impl for n in names] == ["load_skill", "get_stock", "get_price"]
        assert [m["name"] for m in e["messages"] if m["role"] == "tool"] == names
    assert len({e["harness"].version for e in elems}) == len(elems)  # per-record seeds


def test_resume_mid_epoch_yields_the_same_batches(tok):
    config = cfg(p_hsa=0.5, num_epochs=2)
    ds = P.sft_dataset(RECORDS, HARNESSES, tok, config)
    full = list(ds)
    assert len(full) == 6
    it = iter(ds)
    for _ in range(2):
        next(it)
    state = json.loads(json.dumps(it.get_state()))  # checkpoints store it as JSON
    resumed = iter(P.sft_dataset(RECORDS, HARNESSES, tok, config))
    resumed.set_state(state)
    rest = list(resumed)
    assert len(rest) == 4
    for a, b in zip(full[2:], rest, strict=True):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
    # epochs are reshuffled and re-augmented
    assert not all(np.array_equal(full[i]["input_ids"], full[i + 3]["input_ids"]) for i in range(3))


def test_transform_shares_hand_checked():
    only = hsa.HSAConfig(probs={"rename_tools": 1.0}, default_p=0.0)
    assert P.transform_shares(RECORDS, HARNESSES, cfg(p_hsa=1.0, hsa=only)) == {
        **dict.fromkeys(hsa.transform_names(), 0.0),
        "rename_tools": 1.0,
        "original": 0.0,
    }
    assert P.transform_shares(RECORDS, HARNESSES, cfg(p_hsa=0.0)) == {
        **dict.fromkeys(hsa.transform_names(), 0.0),
        "original": 1.0,
    }
    names = hsa.transform_names()
    applied = np.zeros((2, len(names)), np.int8)   # row 0: rename_skills and hook_params; row 1: the original
    applied[0, [names.index("rename_skills"), names.index("hook_params")]] = 1
    flags = [{"hsa_applied": applied}]
    assert P.transform_shares(flags) == {
        **dict.fromkeys(hsa.transform_names(), 0.0),
        "rename_skills": 0.5,
        "hook_params": 0.5,
        "original": 0.5,
    }


def test_transform_shares_of_records_equal_those_of_the_batches(tok):
    config = cfg(p_hsa=0.5)
    from_records = P.transform_shares(RECORDS, HARNESSES, config)
    from_batches = P.transform_shares(P.sft_dataset(RECORDS, HARNESSES, tok, config))
    assert from_records == from_batches and 0.0 < from_records["original"] < 1.0
    # packed rows count their trajectories; rows of 4 x 1500 tokens keep every record (no partial batch dropped)
    packed = list(P.sft_dataset(RECORDS, HARNESSES, tok, cfg(p_hsa=0.5, pack=True, seq_len=1500, batch_size=1)))
    assert sum(int(b["documents"].sum()) for b in packed) == 12
    assert P.transform_shares(packed) == from_records


def test_packed_batches_hold_every_record_whole(tok):
    config = cfg(p_hsa=0.0, pack=True, seq_len=4400, batch_size=2)
    batches = list(P.sft_batches(P.sft_dataset(RECORDS, HARNESSES, tok, config), config))
    assert {k: (v.shape, v.dtype) for k, v in batches[0].items()} == {
        "input_ids": ((2, 4400), np.int32), "loss_mask": ((2, 4400), np.int32),
        "segment_ids": ((2, 4400), np.int32), "positions": ((2, 4400), np.int32),
        "documents": ((2,), np.int32), "truncated": ((2,), np.int32),
        "hsa_applied": ((2, len(hsa.transform_names())), np.int32), "hsa_any": ((2,), np.int32),
    }
    want = sorted((list(ids), list(mask)) for ids, mask in (render_tokens(tok, H, r["messages"]) for r in RECORDS))
    assert 2 * max(len(ids) for ids, _ in want) <= 4400 < 3 * min(len(ids) for ids, _ in want)  # 2 per row
    got = sorted(d for b in batches for d in documents(b))
    assert got == want  # each record exactly once, whole, with its loss mask (first token never a loss token)
    assert sum(int(b["documents"].sum()) for b in batches) == 12 and not any(b["truncated"].any() for b in batches)
    assert len(batches) == 3 and all(b["documents"].tolist() == [2, 2] for b in batches)  # unpacked: 6 batches


def test_packed_resume_mid_epoch_yields_the_same_batches(tok):
    config = cfg(p_hsa=0.5, num_epochs=2, pack=True, seq_len=1500, batch_size=1, pack_bins=3)
    full = list(P.sft_batches(P.sft_dataset(RECORDS, HARNESSES, tok, config), config))
    it = P.sft_batches(P.sft_dataset(RECORDS, HARNESSES, tok, config), config)
    for _ in range(3):
        next(it)
    state = json.loads(json.dumps(it.get_state()))
    assert state["format"] == "packed-v1" and state["documents"] == sum(int(b["documents"].sum()) for b in full[:3])
    resumed = P.sft_batches(P.sft_dataset(RECORDS, HARNESSES, tok, config), config)
    resumed.set_state(state)
    rest = list(resumed)
    assert len(rest) == len(full) - 3 > 0
    for a, b in zip(full[3:], rest, strict=True):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
    old = iter(P.sft_dataset(RECORDS, HARNESSES, tok, cfg(p_hsa=0.5)))  # the unpacked pipeline's state
    next(old)
    with pytest.raises(DataStateFormatError, match="SFT data state: .*unpacked pipeline"):
        P.sft_batches(P.sft_dataset(RECORDS, HARNESSES, tok, config), config).set_state(old.get_state())


def test_packed_truncation_counts_or_refuses(tok):
    config = cfg(p_hsa=0.0, pack=True, seq_len=64, batch_size=2, shuffle=False)
    b = next(P.sft_batches(P.sft_dataset(RECORDS, HARNESSES, tok, config), config))
    assert b["documents"].tolist() == [1, 1] and b["truncated"].tolist() == [1, 1] and b["segment_ids"].all()
    strict = cfg(p_hsa=0.0, pack=True, seq_len=64, batch_size=2, shuffle=False, truncate=False)
    with pytest.raises(ValueError, match=r"document of SFT record 'live-000000': \d+ tokens > seq_len 64 and "
                                         "truncation is off"):
        next(P.sft_batches(P.sft_dataset(RECORDS, HARNESSES, tok, strict), strict))


def test_hook_change_rerolls_or_is_dropped():
    failed = [record(i, failed=True) for i in range(4)]
    hooks_only = hsa.HSAConfig(probs={"hook_params": 1.0}, default_p=0.0)
    dropped = P.hsa_dataset(failed, HARNESSES, cfg(p_hsa=1.0, hsa=hooks_only))
    assert all(not dropped[i]["hsa_applied"].any() and dropped[i]["harness"] is H for i in range(4))
    calls = []

    def reroll(rec, new_h, seed):
        calls.append((rec["task_id"], new_h.hooks[0].params["max_attempts"]))
        return [
            rec["messages"][0],
            rec["messages"][1],
            {"role": "assistant", "content": "重新生成", "reasoning_content": ""},
        ]

    ds = P.hsa_dataset(failed, HARNESSES, cfg(p_hsa=1.0, hsa=hooks_only), reroll=reroll)
    elems = [ds[i] for i in range(4)]
    assert len(calls) == 4 and all(m != 2 for _, m in calls)
    assert all(
        e["messages"][-1]["content"] == "重新生成" and e["hsa_applied"][hsa.transform_names().index("hook_params")]
        for e in elems
    )


def test_config_and_record_errors():
    with pytest.raises(ValueError, match="p_hsa = 1.5"):
        cfg(p_hsa=1.5)
    with pytest.raises(ValueError, match="split = 'dev'"):
        cfg(split="dev")
    with pytest.raises(KeyError, match=r"lacks \['seed'\]"):
        P.hsa_dataset([{k: v for k, v in RECORDS[0].items() if k != "seed"}], HARNESSES, cfg())[0]
    with pytest.raises(KeyError, match="unknown harness_id 'nope'"):
        P.hsa_dataset([{**RECORDS[0], "harness_id": "nope"}], HARNESSES, cfg())[0]


def test_oracle_reroll_runs_the_task_under_the_new_harness():
    from hat_jax.sim.catalog import World
    from hat_jax.sim.env import EnvConfig, LiveStreamEnv
    from hat_jax.sim.oracle import OracleTeacher
    from hat_jax.sim.rollout import rollout
    from hat_jax.sim.viewers import sample_tasks

    world = World.generate(seed=0)
    config = EnvConfig(fault_rates={"error": 1.0, "timeout": 0.0, "empty": 0.0})
    tasks = {t.task_id: t for t in sample_tasks(world, 6, seed=5, intents=["price"])}
    records = [
        {
            "messages": list(rollout(LiveStreamEnv(world, config), OracleTeacher(world), t, H, seed=7).messages),
            "task_id": tid,
            "harness_id": "production",
            "seed": 7,
        }
        for tid, t in tasks.items()
    ]
    reroll = P.oracle_reroll(world, tasks, OracleTeacher(world), config)
    hooks_only = hsa.HSAConfig(probs={"hook_params": 1.0, "rename_tools": 1.0}, default_p=0.0)
    ds = P.hsa_dataset(records, HARNESSES, cfg(p_hsa=1.0, hsa=hooks_only), reroll=reroll)
    for i in range(len(ds)):
        e = ds[i]
        assert e["hsa_applied"][hsa.transform_names().index("hook_params")]
        names = [c["function"]["name"] for m in e["messages"] for c in m.get("tool_calls") or []]
        assert names and all(e["harness"].tool(n) is not None for n in names)
        assert e["messages"][0]["content"] == render_system_prompt(e["harness"])
