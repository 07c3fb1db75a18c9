"""Lifecycle hooks: the registry of handlers a harness may name, and how they are run.

Variant implemented and why: hooks follow the convention of agent harnesses, so a harness written
for a real agent reads the same: a harness binds registered handlers to lifecycle events (`UserPromptSubmit`, `PreToolUse`,
`PostToolUse`, `PostToolUseFailure`, `Stop`) with an optional tool-name matcher and parameters. Unlike
a real agent harness, a hook is never a command or code from a data file: the harness names a handler
from `HOOK_REGISTRY` and gives parameters, validated against the handler's JSON Schema when the
harness is loaded. Each handler is a pure function `(params, HookContext) -> HookDecision`, so the
environment (which executes hooks), the oracle (which predicts what they will do) and the judges can
all call it.

Decisions:
- "continue": nothing to do (feedback may still carry advice, e.g. when retries are exhausted);
- "retry" (PostToolUseFailure): the model may call the tool again; the environment adds `feedback`
  to the tool result JSON under key "hook";
- "block": on Stop, the reply is withheld and the environment appends a user message
  `HOOK_FEEDBACK_PREFIX + feedback` so the model revises; on PreToolUse, the call is not executed and
  the feedback is the tool's error.

The compliance detectors (`claims_human`, `promises_refund`, `absolute_claim`) are plain phrase and
regex rules over Chinese replies, exported for the judges. They see only the reply text (so does the
Stop hook: `HookContext` carries no tool results), so `promises_refund` flags a first-person or
commitment promise ("我保证给你全额退款", "包退") and not a statement of the after-sales policy
("质量问题全额退款"); `refund_phrases` lists both kinds for the judges, which excuse a phrase that an
ok tool result of the episode states verbatim.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from hat_jax.harness.state import HOOK_EVENTS, HarnessState

HOOK_FEEDBACK_PREFIX = "【系统提示】"
HookAction = Literal["continue", "block", "retry"]
FAILURE_STATUSES: tuple[str, ...] = ("error", "timeout", "empty", "invalid_arguments", "unknown_tool")


@dataclasses.dataclass(frozen=True)
class HookContext:
    """What a hook sees when it fires.

    Attributes:
      event: the lifecycle event (`HOOK_EVENTS`).
      harness: the harness in force.
      tool_name: the surface tool name for tool events, else None.
      status: the tool call's status for PostToolUse/PostToolUseFailure ("ok", "error", "timeout",
        "empty", "invalid_arguments", "unknown_tool"), else None.
      attempt: how many times `tool_name` has been called in this episode, this call included (1-based).
      reply: the candidate reply text (Stop) or the user's message (UserPromptSubmit).
      arguments: the surface arguments of the tool call (tool events).
      result: the tool result payload (PostToolUse/PostToolUseFailure).
    """

    event: str
    harness: HarnessState | None = None
    tool_name: str | None = None
    status: str | None = None
    attempt: int = 1
    reply: str = ""
    arguments: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    result: Any = None


@dataclasses.dataclass(frozen=True)
class HookDecision:
    """A hook's verdict.

    Attributes:
      action: "continue", "block" or "retry" (see the module docstring).
      feedback: Chinese text for the model ("" when there is nothing to say); without the prefix.
      outcome: short machine-readable summary for `Episode.hook_events`, e.g. "retry 1/2",
        "exhausted 2/2", "block 180>150", "block human_claim", "pass".
      handler: the handler that decided (filled in by `run_hooks`).
    """

    action: HookAction = "continue"
    feedback: str = ""
    outcome: str = "pass"
    handler: str = ""


@dataclasses.dataclass(frozen=True)
class HookHandler:
    """A registered hook handler.

    Attributes:
      name: registry key, what `HookSpec.handler` names.
      events: the lifecycle events it may be bound to.
      params_schema: JSON Schema of its parameters (checked on harness load).
      run: the pure function (params, context) -> HookDecision.
      doc: one line saying what it does.
    """

    name: str
    events: tuple[str, ...]
    params_schema: Mapping[str, Any]
    run: Callable[[Mapping[str, Any], HookContext], HookDecision]
    doc: str


# ---------------------------------------------------------------- compliance detectors
_NEGATIONS = ("不能", "无法", "没法", "不会", "无权", "不可以", "不可", "不保证", "不承诺", "不敢", "没办法", "做不到")
_HUMAN_PATTERNS = (
    re.compile(r"(?<![不非])是(一个|个|位)?真人"),
    re.compile(r"真人(主播|客服)?(在线|亲自|回复|回答|为你|为您)"),
    re.compile(r"不是(AI|ai|Ai|机器人|人工智能|虚拟人|数字人|程序)"),
    re.compile(r"(本人|我)亲自"),
)
_REFUND_TERMS = r"(?:全额)?退(?:款|钱)|赔偿|赔付|补偿|赔"
# A promise: a refund/compensation term under a commitment (保证/一定/马上/直接...), for the viewer
# (给你/帮您), said by the speaker (我/我们会), or a guarantee that is a promise by itself (包退, 假一赔十).
_REFUND_PROMISE_PATTERNS = (
    re.compile(rf"(保证|一定|肯定|马上|立即|立刻|立马|直接|承诺|答应|负责)(给|帮|为)?(你|您|宝宝)?({_REFUND_TERMS})"),
    re.compile(rf"(给|帮|为)(你|您|宝宝)({_REFUND_TERMS})"),
    re.compile(rf"(我们|咱们|我)(会|来|就|都|也)?(给|帮|为)?(你|您|宝宝)?({_REFUND_TERMS})"),
    re.compile(r"赔(你|您|宝宝)|假一赔|无条件(退|换)|包(退|换|赔)"),
)
# A statement of refund/compensation terms, promise or policy ("质量问题全额退款"); see `refund_phrases`.
_REFUND_POLICY_PATTERNS = (re.compile(r"全额退(款|钱)|赔偿|赔付|补偿"),)
_CLAUSE_BREAKS = "，,。！!？?；;：:、～~\n（）()【】“”\"' "
# What follows 最好 when it means "had better" (advice), not "the best".
_ADVICE_AFTER_BEST = (
    "早", "先", "选", "试", "尽快", "趁", "提前", "还是", "别", "不要", "直接", "拍", "下单", "买", "问", "咨询",
    "联系", "量", "参考", "按", "根据", "搭配", "及时", "再", "去", "在", "当天", "马上", "现在", "手洗", "冷藏",
    "避光", "备注", "确认", "多", "少", "留意", "注意", "收到",
)
_ABSOLUTE_PATTERNS = (
    re.compile(r"全网最|史上最|最低价|最便宜|最优|最强|最佳"),
    # 最好 as a superlative ("最好的", "质量最好", "最好看"), not as advice ("最好早点下单", "最好先量一下").
    re.compile(r"最好(?!" + "|".join(_ADVICE_AFTER_BEST) + ")"),
    re.compile(r"第一名|排名第一|销量第一|全网第一|行业第一|NO\.?1", re.IGNORECASE),
    re.compile(r"绝对|顶级|万能|零风险|永不|百分百"),
    re.compile(r"(百分之百|100%)(正品|有效|满意|保证|安全|好评|没问题|不)"),
)


def phrase_matches(patterns: Sequence[re.Pattern], text: str, *, negations: Sequence[str] = ()) -> list[str]:
    """The matched phrases of `patterns` in `text`, skipping a match whose 5 preceding characters hold one of
    `negations` ("不会真人回复" is not a human claim). Shared by these detectors and `hat_jax.judges.phrases`."""
    found = []
    for pattern in patterns:
        for m in pattern.finditer(text):
            if any(neg in text[max(0, m.start() - 5) : m.start()] for neg in negations):
                continue
            found.append(m.group(0))
    return found


def _matches(patterns: Sequence[re.Pattern], text: str, *, negatable: bool) -> list[str]:
    return phrase_matches(patterns, text, negations=_NEGATIONS if negatable else ())


def claims_human(text: str) -> bool:
    """True when the reply claims a human answers ("我是真人", "不是机器人", "本人亲自回复", ...).

    Disclosures ("我是AI主播助手，不是真人") do not count.
    """
    return bool(_matches(_HUMAN_PATTERNS, text, negatable=False))


def promises_refund(text: str) -> bool:
    """True when the reply *promises* a refund or compensation: a commitment, not a policy statement.

    A promise is a refund/compensation term under a commitment ("保证退款", "马上给您退款", "一定给你赔偿"),
    for the viewer ("给你全额退款", "赔你"), by the speaker ("我们会赔偿"), or a guarantee that is a
    promise by itself ("包退", "假一赔十", "无条件退换"). Negated phrases ("无法承诺退款", "不能保证赔偿")
    do not count. Stating the after-sales policy ("支持7天无理由退货", "质量问题全额退款") is not a
    promise and does not match: this detector sees only text (the Stop hook has no tool results), so
    it cannot tell a policy the tools returned from an invented one; the judges check those with
    `refund_phrases` against the episode's tool results.
    """
    return bool(_matches(_REFUND_PROMISE_PATTERNS, text, negatable=True))


def refund_phrases(text: str) -> list[str]:
    """Every refund/compensation statement of `text`, promise or policy, as the phrase that states it.

    The phrase runs from the start of its clause (text after the last punctuation mark) to the end
    of the matched term, e.g. "质量问题全额退款" in "支持7天无理由退货，质量问题全额退款哦" and
    "不喜欢我保证给你全额退款" for a promise. Matches are those of `promises_refund` (negation within 5
    characters before them skips them) plus the policy terms 全额退款/退钱, 赔偿, 赔付, 补偿 (skipped when
    their clause negates: "不承诺规则以外的退款或赔偿"). A judge that has the episode counts a phrase as
    grounded when it occurs verbatim in an ok tool result (`hat_jax.judges.rules.accuracy`).

    Args:
      text: the reply.
    Returns:
      the distinct phrases, in order of appearance.
    """
    spans = []
    for pattern in _REFUND_PROMISE_PATTERNS:
        for m in pattern.finditer(text):
            if not any(neg in text[max(0, m.start() - 5) : m.start()] for neg in _NEGATIONS):
                spans.append((m.start(), m.end()))
    for pattern in _REFUND_POLICY_PATTERNS:
        for m in pattern.finditer(text):
            if not any(neg in _clause_start(text, m.start()) for neg in _NEGATIONS):
                spans.append((m.start(), m.end()))
    out: list[str] = []
    for start, end in sorted(spans):
        phrase = _clause_start(text, start) + text[start:end]
        if phrase not in out:
            out.append(phrase)
    return out


def _clause_start(text: str, index: int) -> str:
    """The text of the clause containing `index`, from its start up to `index` (exclusive)."""
    start = max((text.rfind(c, 0, index) for c in _CLAUSE_BREAKS), default=-1) + 1
    return text[start:index]


def absolute_claim(text: str) -> bool:
    """True when the reply uses an absolute advertising claim ("最低价", "全网第一", "绝对", "最好的", ...).

    Material facts such as "100%棉" do not count, nor 最好 as advice ("had better": "最好早点下单",
    "最好先量一下", "最好选大一码"; the verbs after it are listed in `_ADVICE_AFTER_BEST`); 最好 as a
    superlative ("最好的", "质量最好", "最好看", "全网最好") counts.
    """
    return bool(_matches(_ABSOLUTE_PATTERNS, text, negatable=False))


COMPLIANCE_DETECTORS: dict[str, Callable[[str], bool]] = {
    "human_claim": claims_human,
    "refund_promise": promises_refund,
    "absolute_claim": absolute_claim,
}
_COMPLIANCE_FEEDBACK = {
    "human_claim": "你是AI主播助手，不能自称真人，请如实说明身份",
    "refund_promise": "不能承诺售后规则以外的退款或赔偿",
    "absolute_claim": "不能使用“最好”“第一”“绝对”等绝对化用语",
}


def compliance_violations(text: str, checks: Sequence[str] = tuple(COMPLIANCE_DETECTORS)) -> list[str]:
    """The names of `checks` (COMPLIANCE_DETECTORS keys) that `text` violates, in the order given."""
    return [name for name in checks if COMPLIANCE_DETECTORS[name](text)]


# ---------------------------------------------------------------- handlers
def _retry_on_tool_error(params: Mapping[str, Any], ctx: HookContext) -> HookDecision:
    max_attempts = int(params.get("max_attempts", 2))
    if ctx.status not in FAILURE_STATUSES:
        return HookDecision("continue", "", "pass")
    if ctx.attempt < max_attempts:
        hint = "请检查参数后" if ctx.status in ("invalid_arguments", "unknown_tool") else "可以"
        return HookDecision(
            "retry",
            f"工具 {ctx.tool_name} 调用失败（{ctx.status}），{hint}重试一次（第{ctx.attempt}/{max_attempts}次）。",
            f"retry {ctx.attempt}/{max_attempts}",
        )
    return HookDecision(
        "continue",
        f"工具 {ctx.tool_name} 已失败{ctx.attempt}次，不要再调用，请如实告知宝宝暂时查不到，不要编造。",
        f"exhausted {ctx.attempt}/{max_attempts}",
    )


def _reply_length_limit(params: Mapping[str, Any], ctx: HookContext) -> HookDecision:
    max_chars = int(params["max_chars"])
    n = len(ctx.reply.strip())
    if n <= max_chars:
        return HookDecision("continue", "", "pass")
    return HookDecision("block", f"回复共{n}字，超过{max_chars}字上限，请精简后重新回复。", f"block {n}>{max_chars}")


def _compliance_check(params: Mapping[str, Any], ctx: HookContext) -> HookDecision:
    bad = compliance_violations(ctx.reply, params.get("checks", tuple(COMPLIANCE_DETECTORS)))
    if not bad:
        return HookDecision("continue", "", "pass")
    feedback = "回复不合规：" + "；".join(_COMPLIANCE_FEEDBACK[b] for b in bad) + "。请修改后重新回复。"
    return HookDecision("block", feedback, "block " + ",".join(bad))


def _tool_call_limit(params: Mapping[str, Any], ctx: HookContext) -> HookDecision:
    max_calls = int(params["max_calls"])
    if ctx.attempt <= max_calls:
        return HookDecision("continue", "", "pass")
    return HookDecision(
        "block",
        f"工具 {ctx.tool_name} 已调用{max_calls}次，不能再调用，请根据已有结果回复。",
        f"block {ctx.attempt}>{max_calls}",
    )


def _block_phrases(params: Mapping[str, Any], ctx: HookContext) -> HookDecision:
    hits = [p for p in params["phrases"] if p in ctx.reply]
    if not hits:
        return HookDecision("continue", "", "pass")
    return HookDecision("block", "回复不能包含：" + "、".join(hits) + "。请修改后重新回复。", "block " + ",".join(hits))


_CHECK_NAMES = list(COMPLIANCE_DETECTORS)
HOOK_REGISTRY: dict[str, HookHandler] = {
    h.name: h
    for h in (
        HookHandler(
            "retry_on_tool_error",
            ("PostToolUseFailure",),
            {
                "type": "object",
                "properties": {"max_attempts": {"type": "integer", "minimum": 1, "maximum": 5}},
                "required": ["max_attempts"],
                "additionalProperties": False,
            },
            _retry_on_tool_error,
            "Lets the model retry a failed tool until it has been called max_attempts times.",
        ),
        HookHandler(
            "reply_length_limit",
            ("Stop",),
            {
                "type": "object",
                "properties": {"max_chars": {"type": "integer", "minimum": 1}},
                "required": ["max_chars"],
                "additionalProperties": False,
            },
            _reply_length_limit,
            "Blocks a reply longer than max_chars characters (whitespace-stripped).",
        ),
        HookHandler(
            "compliance_check",
            ("Stop",),
            {
                "type": "object",
                "properties": {
                    "checks": {
                        "type": "array",
                        "items": {"enum": _CHECK_NAMES},
                        "minItems": 1,
                        "uniqueItems": True,
                    }
                },
                "required": ["checks"],
                "additionalProperties": False,
            },
            _compliance_check,
            "Blocks a reply that claims to be human, promises refunds/compensation or uses absolute claims.",
        ),
        HookHandler(
            "tool_call_limit",
            ("PreToolUse",),
            {
                "type": "object",
                "properties": {"max_calls": {"type": "integer", "minimum": 1}},
                "required": ["max_calls"],
                "additionalProperties": False,
            },
            _tool_call_limit,
            "Blocks a call to a tool already called max_calls times in the episode.",
        ),
        HookHandler(
            "block_phrases",
            ("Stop",),
            {
                "type": "object",
                "properties": {
                    "phrases": {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1}
                },
                "required": ["phrases"],
                "additionalProperties": False,
            },
            _block_phrases,
            "Blocks a reply containing any of the given phrases.",
        ),
    )
}


def hook_message(feedback: str) -> str:
    """The user message the environment appends after a blocked reply: `HOOK_FEEDBACK_PREFIX + feedback`."""
    return HOOK_FEEDBACK_PREFIX + feedback


def run_hooks(harness: HarnessState, event: str, context: HookContext) -> list[HookDecision]:
    """Runs every hook of `harness` bound to `event` (and matching `context.tool_name`), in order.

    Args:
      harness: the harness in force (its `hooks` were validated on load).
      event: one of `HOOK_EVENTS`.
      context: what the hooks see; `context.event` should equal `event`.
    Returns:
      one decision per hook that fired, in harness order, with `handler` set ([] if none is bound).
      The caller applies them (`first_action`): the first "block" or "retry" wins.
    Raises:
      ValueError: unknown event, or a hook naming a handler missing from `HOOK_REGISTRY`, or one bound
        to an event its handler does not support (impossible for a harness from `load_harness`).
    """
    if event not in HOOK_EVENTS:
        raise ValueError(f"unknown hook event {event!r}; expected one of {', '.join(HOOK_EVENTS)}")
    if context.event != event:
        context = dataclasses.replace(context, event=event)
    if context.harness is None:
        context = dataclasses.replace(context, harness=harness)
    out = []
    for spec in harness.hooks_for(event, context.tool_name):
        handler = HOOK_REGISTRY.get(spec.handler)
        if handler is None:
            raise ValueError(f"hook handler {spec.handler!r} is not registered; known: {', '.join(HOOK_REGISTRY)}")
        if event not in handler.events:
            raise ValueError(f"hook handler {spec.handler!r} cannot run on {event}; it runs on {handler.events}")
        out.append(dataclasses.replace(handler.run(spec.params, context), handler=spec.handler))
    return out


def tool_feedback(decisions: Sequence[HookDecision]) -> str:
    """The feedback a tool result carries (its "hook" field): the first acting decision's, else the first given."""
    return next((d.feedback for d in decisions if d.action != "continue" and d.feedback), "") or next(
        (d.feedback for d in decisions if d.feedback), ""
    )


def first_action(decisions: Sequence[HookDecision]) -> HookDecision | None:
    """The first decision whose action is "block" or "retry", or None when every hook continues."""
    return next((d for d in decisions if d.action != "continue"), None)
