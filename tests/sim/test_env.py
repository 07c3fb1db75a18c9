"""LiveStreamEnv: scripted episodes under the production harness (hooks, faults, limits, bad output)."""

import json
import time

import pytest

from hat_jax.harness.hooks import HOOK_FEEDBACK_PREFIX
from hat_jax.harness.render import render_system_prompt
from hat_jax.sim.env import EnvConfig, LiveStreamEnv
from hat_jax.sim.executor import execute_tool_call
from hat_jax.sim.tools import call_world_function
from hat_jax.sim.viewers import sample_tasks


@pytest.fixture(scope="module")
def task(world):
    return sample_tasks(world, 1, seed=0, intents=["price"])[0]


def call(name, **arguments):
    return {
        "role": "assistant",
        "content": "",
        "reasoning_content": "查一下",
        "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}],
    }


def reply(text):
    return {"role": "assistant", "content": text, "reasoning_content": "回复"}


def test_scripted_price_episode(world, harness, task):
    env = LiveStreamEnv(world)
    messages = env.reset(task, harness)
    assert messages == [
        {"role": "system", "content": render_system_prompt(harness)},
        {"role": "user", "content": task.message},
    ]
    pid = task.product_ids[0]
    r1 = env.step(call("load_skill", skill="price-promotion"))
    assert not r1.done and json.loads(r1.new_messages[0]["content"])["skill"] == "price-promotion"
    r2 = env.step(call("search_products", query=task.slots["query"]))
    assert json.loads(r2.new_messages[0]["content"])["products"][0]["product_id"] == pid
    r3 = env.step(call("get_price", product_id=pid))
    assert r3.new_messages == [
        {
            "role": "tool",
            "name": "get_price",
            "content": json.dumps(call_world_function(world, "get_price", {"product_id": pid}), ensure_ascii=False),
        }
    ]
    price = task.gold_facts["live_price"]
    r4 = env.step(reply(f"宝宝，这款直播价{price}元哦"))
    assert r4.done and r4.new_messages == []
    ep = env.episode()
    assert ep.outcome == "replied" and ep.reply == f"宝宝，这款直播价{price}元哦"
    assert [c.name for c in ep.tool_calls] == ["load_skill", "search_products", "get_price"]
    assert [c.round for c in ep.tool_calls] == [0, 1, 2] and {c.status for c in ep.tool_calls} == {"ok"}
    assert ep.tool_calls[2].canonical_args == {"product_id": pid} and ep.tool_calls[2].impl == "get_price"
    assert ep.loaded_skills == ("price-promotion",) and ep.harness_version == harness.version
    assert ep.hook_events == (("Stop", "reply_length_limit", "pass"), ("Stop", "compliance_check", "pass"))
    assert len(ep.messages) == 2 + 3 * 2 + 1 and ep.task == task
    with pytest.raises(RuntimeError, match="ended"):
        env.step(reply("再说一句"))


def test_step_text_parses_reasoning_and_calls(world, harness, task):
    env = LiveStreamEnv(world)
    env.reset(task, harness)
    text = (
        "先加载技能\n</think>\n\n<tool_call>\n<function=load_skill>\n<parameter=skill>\nprice-promotion\n"
        "</parameter>\n</function>\n</tool_call><|im_end|>"
    )
    r = env.step_text(text)
    assert r.assistant["reasoning_content"] == "先加载技能" and r.assistant["content"] == ""
    assert r.assistant["tool_calls"][0]["function"] == {"name": "load_skill", "arguments": {"skill": "price-promotion"}}
    r = env.step_text("价格查不到\n</think>\n\n宝宝稍等哦")
    assert r.done and env.episode().reply == "宝宝稍等哦" and env.episode().outcome == "replied"


def test_retry_hook_on_injected_error(world, harness, task):
    env = LiveStreamEnv(world, EnvConfig(fault_rates={"error": 1.0}))
    env.reset(task, harness)
    env.step(call("load_skill", skill="price-promotion"))  # the skill loader is never faulted
    first = json.loads(env.step(call("get_price", product_id="P0001")).new_messages[0]["content"])
    assert first["error"]["type"] == "service_error" and "重试" in first["hook"]
    second = json.loads(env.step(call("get_price", product_id="P0001")).new_messages[0]["content"])
    assert "不要再调用" in second["hook"]
    ep = env.episode()
    assert [c.status for c in ep.tool_calls] == ["ok", "error", "error"]
    assert ep.hook_events == (
        ("PostToolUseFailure", "retry_on_tool_error", "retry 1/2"),
        ("PostToolUseFailure", "retry_on_tool_error", "exhausted 2/2"),
    )


def test_timeout_fault_and_wall_clock(world, harness, task):
    env = LiveStreamEnv(world, EnvConfig(tool_timeout_s=5.0, fault_rates={"timeout": 1.0}))
    env.reset(task, harness)
    env.step(call("get_price", product_id="P0001"))
    rec = env.episode().tool_calls[0]
    assert rec.status == "timeout" and rec.latency_s == 5.0 and rec.result["error"]["type"] == "timeout"

    def slow(w, h, name, args, fault):
        time.sleep(0.05)
        return execute_tool_call(w, h, name, args, fault=fault)

    env = LiveStreamEnv(world, EnvConfig(tool_timeout_s=0.01), tool_runner=slow)
    env.reset(task, harness)
    env.step(call("get_price", product_id="P0001"))
    rec = env.episode().tool_calls[0]
    assert rec.status == "timeout" and rec.latency_s >= 0.05 and "live_price" not in rec.result


def test_faults_seeded_per_episode_and_call(world, harness, task):
    def statuses(seed):
        env = LiveStreamEnv(world, EnvConfig(max_tool_rounds=20, fault_rates={"error": 0.3, "empty": 0.3}))
        env.reset(task, harness, seed=seed)
        for _ in range(12):
            env.step(call("get_price", product_id="P0001"))
        return [c.status for c in env.episode().tool_calls]

    a = statuses(1)
    assert a == statuses(1) and a != statuses(2)
    assert {"ok", "error", "empty"} <= set(a)


def test_reply_blocked_by_length_then_revised(world, harness, task):
    env = LiveStreamEnv(world)
    env.reset(task, harness)
    r = env.step(reply("宝宝" * 80))  # 160 > 150 characters
    assert not r.done and r.new_messages[0]["role"] == "user"
    assert r.new_messages[0]["content"].startswith(HOOK_FEEDBACK_PREFIX) and "150" in r.new_messages[0]["content"]
    r = env.step(reply("宝宝，直播价99元"))
    ep = env.episode()
    assert r.done and ep.outcome == "replied" and ep.reply == "宝宝，直播价99元"
    assert ep.hook_events[0] == ("Stop", "reply_length_limit", "block 160>150")


def test_reply_still_blocked_gives_no_reply(world, harness, task):
    env = LiveStreamEnv(world)
    env.reset(task, harness)
    env.step(reply("我是真人主播哦"))
    r = env.step(reply("我是真人，这个全网最低价"))
    ep = env.episode()
    assert r.done and ep.outcome == "no_reply" and ep.reply == ""
    assert ("Stop", "compliance_check", "block human_claim") in ep.hook_events


def test_round_limit(world, harness, task):
    env = LiveStreamEnv(world, EnvConfig(max_tool_rounds=4))
    env.reset(task, harness)
    for _ in range(4):
        assert not env.step(call("search_products", query="连衣裙")).done
    r = env.step(call("search_products", query="连衣裙"))
    ep = env.episode()
    assert r.done and r.new_messages == [] and ep.outcome == "round_limit" and len(ep.tool_calls) == 4


def test_skill_only_turns_are_not_tool_rounds(world, harness, task):
    """A stock question needs search, detail and stock after loading the skill: with one retry that is
    still within 4 tool rounds because the skill-only turn does not count; skill-only turns have their own cap."""
    env = LiveStreamEnv(world, EnvConfig(max_tool_rounds=4, max_skill_turns=2))
    env.reset(task, harness)
    assert not env.step(call("load_skill", skill="product-qa")).done
    for _ in range(4):
        assert not env.step(call("search_products", query="连衣裙")).done
    assert [c.round for c in env.episode().tool_calls] == [0, 1, 2, 3, 4]
    assert env.step(call("search_products", query="连衣裙")).done and env.episode().outcome == "round_limit"
    env.reset(task, harness)
    assert not env.step(call("load_skill", skill="product-qa")).done
    assert not env.step(call("load_skill", skill="price-promotion")).done
    r = env.step(call("load_skill", skill="engagement"))
    assert r.done and env.episode().outcome == "round_limit" and len(env.episode().tool_calls) == 2


def test_invalid_arguments_and_unknown_tool(world, harness, task):
    env = LiveStreamEnv(world)
    env.reset(task, harness)
    msg = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": "get_stock", "arguments": {"sku": "P0001-黑色-M"}}},
            {"type": "function", "function": {"name": "check_inventory", "arguments": '{"sku_id": "P0001-黑色-M"}'}},
        ],
    }
    r = env.step(msg)
    bad, unknown = (json.loads(m["content"]) for m in r.new_messages)
    assert bad["error"]["type"] == "invalid_arguments" and "sku_id" in bad["error"]["message"]
    assert unknown["error"]["type"] == "unknown_tool" and "get_stock" in unknown["error"]["details"]["available_tools"]
    assert [c.status for c in env.episode().tool_calls] == ["invalid_arguments", "unknown_tool"]
    assert env.episode().tool_calls[1].arguments == {"sku_id": "P0001-黑色-M"}
    assert not r.done


def test_malformed_text(world, harness, task):
    env = LiveStreamEnv(world)
    env.reset(task, harness)
    r = env.step_text("想想\n</think>\n\n<tool_call>\n<function=get_price>\n<parameter=product_id>\nP0001\n")
    ep = env.episode()
    assert r.done and ep.outcome == "malformed" and ep.reply == "" and ep.tool_calls == ()
    assert ep.messages[-1]["role"] == "assistant"


def test_empty_reply_and_misuse(world, harness, task):
    env = LiveStreamEnv(world)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(reply("hi"))
    env.reset(task, harness)
    assert env.step(reply("  ")).done and env.episode().outcome == "no_reply"
    with pytest.raises(ValueError, match="max_tool_rounds"):
        EnvConfig(max_tool_rounds=0)
    with pytest.raises(ValueError, match="fault_rates"):
        EnvConfig(fault_rates={"error": 0.9, "timeout": 0.9})


def test_fault_rates_and_limits_are_checked_with_the_field_named():
    for rates, expected in [
        ({"error": float("nan")}, r"fault_rates\['error'\] = nan: expected a probability"),
        ({"error": "0.1"}, r"fault_rates\['error'\] = '0.1'"),
        ({"error": True}, r"fault_rates\['error'\] = True"),
        ({"crash": 0.1}, "unknown fault kind 'crash'"),
        ({"error": 0.6, "empty": 0.6}, "sum to <= 1"),
        ([0.1], "expected a mapping"),
    ]:
        with pytest.raises(ValueError, match=expected):
            EnvConfig(fault_rates=rates)
    with pytest.raises(ValueError, match="EnvConfig.max_tool_rounds must be an int >= 1, got '4'"):
        EnvConfig(max_tool_rounds="4")
    with pytest.raises(ValueError, match="EnvConfig.tool_timeout_s"):
        EnvConfig(tool_timeout_s=float("nan"))
    assert EnvConfig(fault_rates={"error": 1, "timeout": 0}).fault_rates == {"error": 1, "timeout": 0}


def test_step_misuse_and_malformed_message_fields(world, harness, task):
    env = LiveStreamEnv(world)
    env.reset(task, harness)
    for bad in ("好的宝宝", None):
        with pytest.raises(TypeError, match="step_text"):
            env.step(bad)
    # content as OpenAI text parts is joined
    r = env.step({"role": "assistant", "content": [{"type": "text", "text": "宝宝，"}, "这款188.9元"]})
    assert r.done and env.episode().outcome == "replied" and env.episode().reply == "宝宝，这款188.9元"
    # tool_calls as a string is malformed (not one call per character); so is numeric content
    for message in (
        {"role": "assistant", "content": "", "tool_calls": "get_price"},
        {"role": "assistant", "content": 42},
        {"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
    ):
        env.reset(task, harness)
        r = env.step(message)
        ep = env.episode()
        assert r.done and r.new_messages == [] and ep.outcome == "malformed" and ep.tool_calls == ()
        assert ep.messages[-1]["role"] == "assistant" and isinstance(ep.messages[-1]["content"], str)


def test_fuzzed_tool_calls_never_raise_out_of_step(world, harness, task):
    from test_executor import ODD_VALUES

    cfg = EnvConfig(max_tool_rounds=1000, max_skill_turns=1000, fault_rates={"error": 0.1, "timeout": 0.1, "empty": 0.1})
    env = LiveStreamEnv(world, cfg)
    env.reset(task, harness)
    statuses = set()
    for tool in harness.tools:
        for prop in tool.input_schema["properties"]:
            for value in ODD_VALUES:
                r = env.step(call(tool.name, **{prop: value}))
                assert not r.done and len(r.new_messages) == 1
                statuses.add(env.episode().tool_calls[-1].status)
    odd_calls = [None, 5, "get_price", [], {"function": None}, {"function": {"name": None, "arguments": "{"}}]
    r = env.step({"role": "assistant", "content": "", "tool_calls": odd_calls})
    assert [c.status for c in env.episode().tool_calls[-len(odd_calls):]] == ["unknown_tool"] * len(odd_calls)
    assert {"ok", "invalid_arguments"} <= statuses and "internal_error" not in {
        c.result.get("error", {}).get("type") for c in env.episode().tool_calls
    }
