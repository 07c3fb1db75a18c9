"""Recovery turns: a misread call of the original harness, the environment's exact refusal, the retry; loss mask."""

import dataclasses
import json
import random

import numpy as np
import pytest

from hat_jax.data import pipeline as P
from hat_jax.data.recovery import insert_misread, misread_call
from hat_jax.harness import hsa
from hat_jax.harness.render import render_system_prompt, render_text, render_tokens
from hat_jax.sim.env import EnvConfig, LiveStreamEnv
from hat_jax.sim.oracle import OracleTeacher
from hat_jax.sim.rollout import rollout
from hat_jax.sim.viewers import sample_tasks
from hat_jax.tokenizer import train_bpe_tokenizer

LIMITS = dict(max_tool_rounds=EnvConfig().max_tool_rounds, max_skill_turns=EnvConfig().max_skill_turns)


def renamed_loader_key(h, key="SkillId"):
    """`h` with the skill loader's argument written `key` (the Variant QA failure: a renamed key)."""
    tool = h.tool(h.skill_tool)
    prop = tool.input_schema["properties"]["skill"]
    schema = {"type": "object", "properties": {key: prop}, "required": [key]}
    new = dataclasses.replace(tool, input_schema=schema, arg_paths={"skill": (key,)})
    return h.replace(tools=tuple(new if t.name == tool.name else t for t in h.tools))


def loader_turn(h, value="price-promotion", key="skill"):
    call = {"type": "function", "function": {"name": h.skill_tool, "arguments": {key: value}}}
    return {"role": "assistant", "content": "", "reasoning_content": "加载技能。", "tool_calls": [call]}


def test_misread_call_writes_the_original_key_or_name(harness):
    new = renamed_loader_key(harness)
    call = {"name": "load_skill", "arguments": {"SkillId": "price-promotion"}}
    assert misread_call(harness, new, call) == (
        "load_skill", {"skill": "price-promotion"}, "参数名应为SkillId，按工具定义重新调用。")
    assert misread_call(harness, harness, {"name": "load_skill", "arguments": {"skill": "size-advice"}}) is None
    tool = harness.tool("get_price")
    renamed = harness.replace(tools=tuple(dataclasses.replace(t, name="live_get_price") if t is tool else t
                                          for t in harness.tools))
    assert misread_call(harness, renamed, {"name": "live_get_price", "arguments": {"product_id": "P0001"}}) == (
        "get_price", {"product_id": "P0001"}, "工具名应为live_get_price，重新调用。")
    assert misread_call(harness, renamed, {"name": "no_such_tool", "arguments": {}}) is None


def test_insert_misread_hand_checked(harness):
    new = renamed_loader_key(harness)
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "多少钱？"},
                loader_turn(new, key="SkillId"),
                {"role": "tool", "name": "load_skill", "content": "{}"},
                {"role": "assistant", "content": "宝宝，99元。", "reasoning_content": "回答。"}]
    out = insert_misread(messages, harness, new, random.Random(0), **LIMITS)
    assert out[:2] == messages[:2] and out[5:] == messages[3:]
    wrong, refusal, retry = out[2:5]
    assert wrong["weight"] == 0 and wrong["reasoning_content"] == "加载技能。"
    assert wrong["tool_calls"][0]["function"] == {"name": "load_skill", "arguments": {"skill": "price-promotion"}}
    assert json.loads(refusal["content"]) == {
        "error": {"type": "invalid_arguments",
                  "message": "工具 load_skill 的参数不合法（invalid arguments）：(root): 'SkillId' is a required property",
                  "details": {"errors": [{"path": "(root)", "message": "'SkillId' is a required property"}]}},
        "hook": "工具 load_skill 调用失败（invalid_arguments），请检查参数后重试一次（第1/2次）。"}
    assert refusal["name"] == "load_skill"
    assert retry == {**messages[2], "reasoning_content": "参数名应为SkillId，按工具定义重新调用。加载技能。"}
    assert messages[2].get("weight") is None  # inputs unchanged


def test_insert_misread_refuses_what_the_environment_would_not_allow(harness):
    new = renamed_loader_key(harness)
    turn = loader_turn(new, key="SkillId")
    tool_msg = {"role": "tool", "name": "load_skill", "content": "{}"}
    base = [{"role": "user", "content": "q"}]
    same = [*base, loader_turn(harness), tool_msg]
    assert insert_misread(same, harness, harness, random.Random(0), **LIMITS) is None  # nothing was renamed
    # the skill-only turns are used up: no room for a second one
    assert insert_misread([*base, turn, tool_msg], harness, new, random.Random(0), max_tool_rounds=4,
                          max_skill_turns=1) is None
    # the loader is called twice: a retry's hook feedback would differ from the recorded one
    assert insert_misread([*base, turn, tool_msg, turn, tool_msg], harness, new, random.Random(0), **LIMITS) is None
    # a hook that allows no retry (max_attempts 1) answers "continue": no recovery is written
    no_retry = new.replace(hooks=tuple(dataclasses.replace(s, params={"max_attempts": 1})
                                       if s.handler == "retry_on_tool_error" else s for s in new.hooks))
    assert insert_misread([*base, turn, tool_msg], harness, no_retry, random.Random(0), **LIMITS) is None
    # the recorded call itself failed (a fault, then its hook feedback): that feedback was written for attempt 1
    failed = {"role": "tool", "name": "load_skill", "content": json.dumps(
        {"error": {"type": "timeout", "message": "超时"}, "hook": "请重试"}, ensure_ascii=False)}
    assert insert_misread([*base, turn, failed], harness, new, random.Random(0), **LIMITS) is None
    assert insert_misread([*base, turn, {**tool_msg, "content": "not json"}], harness, new, random.Random(0),
                          **LIMITS) is None
    assert insert_misread([*base, turn, tool_msg], harness, new, random.Random(0), **LIMITS) is not None


def test_inserted_turns_replay_exactly_in_the_environment(world, harness):
    """The misread call and the retry, stepped through LiveStreamEnv under the variant, give the same tool messages."""
    tasks = sample_tasks(world, 4, seed=3)
    checked = 0
    for seed in range(40):
        new, _, applied = hsa.compose(harness, random.Random(seed), hsa.HSAConfig(), "train")
        if "hook_params" in applied:
            continue
        task = tasks[seed % len(tasks)]
        episode = rollout(LiveStreamEnv(world), OracleTeacher(world), task, new)
        out = insert_misread(list(episode.messages), harness, new, random.Random(seed), **LIMITS)
        if out is None:
            continue
        env = LiveStreamEnv(world)
        replayed = env.reset(task, new)
        for m in out[len(replayed):]:
            if m["role"] == "assistant":
                step = env.step({k: v for k, v in m.items() if k != "weight"})
                replayed += [step.assistant, *step.new_messages]
        tools = [m for m in out if m["role"] == "tool"]
        assert [m for m in replayed if m["role"] == "tool"] == tools
        assert json.loads(tools[[m.get("weight") for m in out if m["role"] == "assistant" and m.get("tool_calls")]
                                .index(0)]["content"])["error"]["type"] in ("invalid_arguments", "unknown_tool")
        assert env.done and env.episode().reply == episode.reply
        checked += 1
        if checked == 3:
            break
    assert checked == 3


@pytest.fixture(scope="module")
def tok(tmp_path_factory, harness):
    texts = [render_system_prompt(harness), json.dumps(harness.openai_tools(), ensure_ascii=False)] * 3
    texts += ["加载技能。参数名应为SkillId，按工具定义重新调用。宝宝，99元。回答。"] * 3
    return train_bpe_tokenizer(texts, 600, tmp_path_factory.mktemp("tok"))


def test_weight_zero_turn_is_out_of_the_loss(tok, harness):
    new = renamed_loader_key(harness)
    messages = [{"role": "user", "content": "多少钱？"}, loader_turn(new, key="SkillId"),
                {"role": "tool", "name": "load_skill", "content": "{}"},
                {"role": "assistant", "content": "宝宝，99元。", "reasoning_content": "回答。"}]
    out = insert_misread(messages, harness, new, random.Random(0), **LIMITS)
    ids, mask = render_tokens(tok, new, out)
    ids_w, mask_w = render_tokens(tok, new, [{k: v for k, v in m.items() if k != "weight"} for m in out])
    assert np.array_equal(ids, ids_w)  # the key is not rendered
    text = render_text(tok, new, out)
    assert '"weight"' not in text
    # exactly the misread turn's generated tokens drop out: the first assistant span
    dropped = np.flatnonzero(mask_w != mask)
    assert dropped.size > 0 and np.all(mask_w[dropped] == 1) and np.all(mask[dropped] == 0)
    first = tok.decode(ids[dropped].tolist())
    assert "<tool_call>" in first and "<parameter=skill>" in first and "SkillId" not in first


def test_pipeline_p_recovery(harness):
    from test_pipeline import RECORDS  # the pipeline tests' production-harness records

    assert P.SFTDataConfig().p_recovery == 0.0
    cfg = dict(seq_len=4096, batch_size=4, seed=3, read_threads=1, prefetch=2, pack=False, p_hsa=1.0)
    plain = P.hsa_dataset(RECORDS, {"production": harness}, P.SFTDataConfig(**cfg))
    rec = P.hsa_dataset(RECORDS, {"production": harness}, P.SFTDataConfig(**cfg, p_recovery=1.0))
    n_misread = 0
    for i in range(len(RECORDS)):
        a, b = plain[i], rec[i]
        assert a["harness"] == b["harness"] and a["task_id"] == b["task_id"]  # recovery draws apart from HSA's
        weights = [m.get("weight") for m in b["messages"]]
        if 0 in weights:
            n_misread += 1
            j = weights.index(0)
            assert b["messages"][:j] == a["messages"][:j] and b["messages"][j + 3:] == a["messages"][j + 1:]
        else:
            assert b["messages"] == a["messages"]
    assert n_misread > 0
    # the records' environment bounds the extra turn: one world-tool round and no skill-only turn leave none to spare
    tight = EnvConfig(max_tool_rounds=1, max_skill_turns=0)
    bounded = P.hsa_dataset(RECORDS, {"production": harness}, P.SFTDataConfig(**cfg, p_recovery=1.0), env_config=tight)
    assert all(0 not in [m.get("weight") for m in bounded[i]["messages"]] for i in range(len(RECORDS)))


@pytest.mark.parametrize("bad", [1.5, -0.1, True, "0.5", None])
def test_p_recovery_must_be_a_probability(bad):
    with pytest.raises(ValueError, match=r"SFTDataConfig\.p_recovery = .*expected a probability"):
        P.SFTDataConfig(p_recovery=bad)


def test_p_recovery_needs_hsa_and_the_original_switch_drops_it():
    from hat_jax.train.sft import SFTConfig, with_hsa

    with pytest.raises(ValueError, match="p_recovery = 0.5 needs p_hsa > 0"):
        P.SFTDataConfig(p_hsa=0.0, p_recovery=0.5)
    cfg = dataclasses.replace(SFTConfig(), data=dataclasses.replace(SFTConfig().data, p_recovery=0.5))
    assert (with_hsa(cfg, False).data.p_hsa, with_hsa(cfg, False).data.p_recovery) == (0.0, 0.0)
    assert (with_hsa(cfg, True).data.p_hsa, with_hsa(cfg, True).data.p_recovery) == (cfg.data.p_hsa, 0.5)


def test_config_json_omits_p_recovery_at_its_default():
    from hat_jax.train.sft import SFTConfig
    from hat_jax.train.stage import config_json

    assert "p_recovery" not in config_json(SFTConfig())["data"]
    cfg = dataclasses.replace(SFTConfig(), data=dataclasses.replace(SFTConfig().data, p_recovery=0.5))
    assert config_json(cfg)["data"]["p_recovery"] == 0.5
