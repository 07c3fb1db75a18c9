"""Hook handlers, `run_hooks` and the compliance detectors, on hand-checked cases."""

import pytest

from hat_jax.harness.hooks import (
    HOOK_FEEDBACK_PREFIX,
    HOOK_REGISTRY,
    HookContext,
    HookDecision,
    absolute_claim,
    claims_human,
    compliance_violations,
    first_action,
    hook_message,
    promises_refund,
    refund_phrases,
    run_hooks,
)
from hat_jax.harness.state import HookSpec
from hat_jax.sim.world_harness import production_harness


def test_retry_on_tool_error_production_max_attempts_2():
    h = production_harness()
    first = run_hooks(h, "PostToolUseFailure", HookContext("PostToolUseFailure", h, "get_price", "timeout", attempt=1))
    assert [(d.handler, d.action, d.outcome) for d in first] == [("retry_on_tool_error", "retry", "retry 1/2")]
    assert first[0].feedback == "工具 get_price 调用失败（timeout），可以重试一次（第1/2次）。"
    second = run_hooks(h, "PostToolUseFailure", HookContext("PostToolUseFailure", h, "get_price", "error", attempt=2))
    assert (second[0].action, second[0].outcome) == ("continue", "exhausted 2/2")
    assert "不要编造" in second[0].feedback
    bad_args = run_hooks(
        h, "PostToolUseFailure", HookContext("PostToolUseFailure", h, "get_stock", "invalid_arguments")
    )
    assert bad_args[0].action == "retry" and "请检查参数后重试" in bad_args[0].feedback
    ok = HOOK_REGISTRY["retry_on_tool_error"].run({"max_attempts": 2}, HookContext("PostToolUseFailure", h, "x", "ok"))
    assert ok == HookDecision("continue", "", "pass")


def test_stop_hooks_on_production():
    h = production_harness()
    good = "宝宝，这款直播价199元，库存还有12件。"
    assert [(d.handler, d.action) for d in run_hooks(h, "Stop", HookContext("Stop", h, reply=good))] == [
        ("reply_length_limit", "continue"),
        ("compliance_check", "continue"),
    ]
    long = "宝" * 151
    length = run_hooks(h, "Stop", HookContext("Stop", h, reply=long))[0]
    assert (length.action, length.outcome) == ("block", "block 151>150")
    assert length.feedback == "回复共151字，超过150字上限，请精简后重新回复。"
    assert run_hooks(h, "Stop", HookContext("Stop", h, reply="宝" * 150))[0].action == "continue"
    bad = run_hooks(h, "Stop", HookContext("Stop", h, reply="宝宝我是真人主播，不满意保证全额退款！"))
    assert first_action(bad) is bad[1]
    assert (bad[1].action, bad[1].outcome) == ("block", "block human_claim,refund_promise")
    assert bad[1].feedback.startswith("回复不合规：你是AI主播助手")
    assert hook_message(bad[1].feedback) == HOOK_FEEDBACK_PREFIX + bad[1].feedback == "【系统提示】" + bad[1].feedback


def test_run_hooks_matcher_event_and_no_hooks():
    h = production_harness()
    assert run_hooks(h, "PreToolUse", HookContext("PreToolUse", h, "get_price")) == []
    limited = h.replace(hooks=(HookSpec("PreToolUse", "tool_call_limit", "get_price", {"max_calls": 2}),))
    assert run_hooks(limited, "PreToolUse", HookContext("PreToolUse", limited, "get_stock", attempt=9)) == []
    third = run_hooks(limited, "PreToolUse", HookContext("PreToolUse", limited, "get_price", attempt=3))
    assert (third[0].action, third[0].outcome) == ("block", "block 3>2")
    assert (
        run_hooks(limited, "PreToolUse", HookContext("PreToolUse", None, "get_price", attempt=2))[0].action
        == "continue"
    )
    phrases = h.replace(hooks=(HookSpec("Stop", "block_phrases", None, {"phrases": ["加微信", "私聊"]}),))
    d = run_hooks(phrases, "Stop", HookContext("Stop", phrases, reply="宝宝私聊我加微信"))[0]
    assert (d.action, d.outcome) == ("block", "block 加微信,私聊")
    with pytest.raises(ValueError, match="unknown hook event 'AfterReply'"):
        run_hooks(h, "AfterReply", HookContext("AfterReply", h))
    with pytest.raises(ValueError, match="not registered"):
        run_hooks(h.replace(hooks=(HookSpec("Stop", "shell", None, {}),)), "Stop", HookContext("Stop", h))


@pytest.mark.parametrize(
    "text, human",
    [
        ("我是真人哦宝宝", True),
        ("宝宝，是真人在线回复你", True),
        ("我不是机器人啦", True),
        ("本人亲自试穿过", True),
        ("我是AI主播助手，不是真人哦", False),
        ("我并非真人，是AI主播助手", False),
        ("宝宝问我是不是真人？我是AI助手", False),
    ],
)
def test_claims_human(text, human):
    assert claims_human(text) is human


@pytest.mark.parametrize(
    "text, refund",
    [
        ("不满意保证退款", True),
        ("马上给您退款", True),
        ("我们会赔偿你的损失", True),
        ("无条件退换", True),
        ("不喜欢我保证给你全额退款", True),
        ("假一赔十，放心买", True),
        ("7天包退", True),
        ("这个我无法承诺退款哦", False),
        ("不能保证赔偿，按售后规则处理", False),
        ("支持7天无理由退货，运费险包邮", False),
        # statements of policy, not promises (the judges check them against the tool results)
        ("支持7天无理由退货，质量问题全额退款", False),
        ("宝宝放心，全额退款", False),
        ("破损可以申请补偿", False),
    ],
)
def test_promises_refund(text, refund):
    assert promises_refund(text) is refund


@pytest.mark.parametrize(
    "text, found",
    [
        ("支持7天无理由退货，质量问题全额退款哦", ["质量问题全额退款"]),
        ("放心买，不喜欢我保证给你全额退款！", ["不喜欢我保证给你全额退款"]),
        ("我们会赔偿你的损失", ["我们会赔偿"]),
        ("假一赔十", ["假一赔"]),
        ("不承诺规则以外的退款或赔偿", []),
        ("这个我无法承诺退款哦", []),
        ("支持7天无理由退货", []),
    ],
)
def test_refund_phrases_lists_promises_and_policy_statements(text, found):
    assert refund_phrases(text) == found


@pytest.mark.parametrize(
    "text, absolute",
    [
        ("全网最低价", True),
        ("销量第一的款", True),
        ("绝对不起球", True),
        ("100%正品", True),
        ("面料是100%棉", False),
        ("这是第一次上架", False),
        ("直播价199元，比原价便宜50元", False),
        # 最好 as a superlative counts, as advice ("had better") does not
        ("这是最好的面料", True),
        ("全网最好", True),
        ("这款质量最好。", True),
        ("这款最好看", True),
        ("到手价199元哦，喜欢的话最好早点下单～", False),
        ("最好先量一下腰围", False),
        ("偏小，最好选大一码", False),
        ("最好趁现在下单", False),
    ],
)
def test_absolute_claim(text, absolute):
    assert absolute_claim(text) is absolute


def test_compliance_violations_order_and_subset():
    text = "我是真人，全网最低价，保证退款"
    assert compliance_violations(text) == ["human_claim", "refund_promise", "absolute_claim"]
    assert compliance_violations(text, ["absolute_claim"]) == ["absolute_claim"]
    assert compliance_violations("宝宝好") == []


def test_registry_entries_are_complete():
    for name, handler in HOOK_REGISTRY.items():
        assert handler.name == name and handler.events and handler.doc
        assert handler.params_schema["type"] == "object"
