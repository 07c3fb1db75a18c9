"""The live-stream episode environment (`LiveStreamEnv`): one viewer message, tool rounds, one reply.

Protocol (shared by the oracle, model rollouts and the deployed agent loop): `reset(task, harness)` returns
[system, user] with the system prompt rendered from the harness; each `step(assistant_message)` is
one assistant turn:
- a turn with tool calls is one tool round. Each call runs PreToolUse hooks (a "block" skips it and
  its feedback is the tool's error), is executed (`hat_jax.sim.executor.execute_tool_call`, with an
  injected fault drawn from `random.Random(f"fault:{episode seed}:{call index}")`), then runs
  PostToolUse hooks (status "ok") or PostToolUseFailure hooks (any failure status, "empty" included,
  as `hat_jax.harness.hooks.FAILURE_STATUSES` says). The first non-empty hook feedback (a retry
  offer, or advice once retries are exhausted) is added to the tool result under key "hook". One
  `tool` message per call is appended. A tool-call turn after `max_tool_rounds` rounds ends the
  episode unexecuted with outcome "round_limit". A turn that only calls the skill-loading tool is
  skill selection, not a tool round (the paper's "at most 4 rounds" are world-tool rounds; a stock
  question needs search, detail and stock, and a retry must still fit); such turns are capped
  separately by `max_skill_turns`.
- a turn without tool calls is the reply. An empty reply ends with "no_reply". Otherwise Stop hooks
  run; a "block" appends the user message `HOOK_FEEDBACK_PREFIX + feedback` and the model revises, at
  most `max_reply_revisions` times; a reply still blocked ends with "no_reply" and reply "".
- `step_text(text)` parses raw generated text (`split_reasoning`, `parse_tool_calls` typed by the
  harness's tools); text that does not parse ends the episode with outcome "malformed".
- `step(message)` takes an OpenAI assistant message (a mapping); a field of a shape the model may get
  wrong (`step` lists them) is a malformed turn: it is recorded and ends the episode with outcome "malformed".

Timeouts (`EnvConfig.tool_timeout_s`): a "timeout" fault is simulated, and a call that really runs longer than
`tool_timeout_s` (a slow `tool_runner`, e.g. over MCP) is reported as "timeout" too. The skill loader is never faulted.

Model mistakes (unknown tool, bad arguments, unknown skill, malformed text or message fields) never raise; caller
bugs do (`step` before `reset` or after the end: RuntimeError; a `step` argument that is not a mapping: TypeError).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from hat_jax.harness.hooks import FAILURE_STATUSES, HookContext, first_action, hook_message, run_hooks, tool_feedback
from hat_jax.harness.state import SKILL_TOOL_IMPL, HarnessState
from hat_jax.sim.catalog import World
from hat_jax.sim.executor import (
    FAULT_MESSAGES,
    ToolExecution,
    check_fault_rates,
    draw_fault,
    error_payload,
    execute_tool_call,
    limit_result_size,
    parse_arguments,
)
from hat_jax.sim.types import Episode, Task, ToolCallRecord
from hat_jax.tokenizer import parse_tool_calls, split_reasoning

# (world, harness, name, arguments, fault) -> ToolExecution
ToolRunner = Callable[[World, HarnessState, str, Any, "str | None"], ToolExecution]


def _default_fault_rates() -> dict[str, float]:
    return {"error": 0.0, "timeout": 0.0, "empty": 0.0}


@dataclasses.dataclass(frozen=True)
class EnvConfig:
    """Episode limits and fault injection.

    Attributes:
      max_tool_rounds: tool-calling turns allowed (the paper: at most 4 rounds).
      tool_timeout_s: per-call timeout in seconds (the paper: 5 s). In-process calls are instant, so a
        "timeout" fault is simulated: status "timeout", the timeout error payload, latency = tool_timeout_s. A
        call that really takes longer than tool_timeout_s of wall time (a slow `tool_runner`, e.g. over MCP) is
        also reported as "timeout", checked after the call returns (an in-process call cannot be interrupted).
      fault_rates: probability of each injected fault per world-tool call ("error", "timeout",
        "empty"; numbers in [0, 1] summing to <= 1, checked by `check_fault_rates`).
      max_reply_revisions: how many times a reply blocked by a Stop hook may be revised.
      max_skill_turns: turns that only load skills allowed besides the tool rounds.
    """

    max_tool_rounds: int = 4
    tool_timeout_s: float = 5.0
    fault_rates: Mapping[str, float] = dataclasses.field(default_factory=_default_fault_rates)
    max_reply_revisions: int = 1
    max_skill_turns: int = 2

    def __post_init__(self) -> None:
        for name, low in (("max_tool_rounds", 1), ("max_skill_turns", 0), ("max_reply_revisions", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"EnvConfig.{name} must be an int >= {low}, got {value!r}")
        t = self.tool_timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < float("inf"):
            raise ValueError(f"EnvConfig.tool_timeout_s must be a finite number > 0, got {t!r}")
        check_fault_rates(self.fault_rates, "EnvConfig.fault_rates")


class StepResult(NamedTuple):
    """What one step added: `new_messages` (tool results or hook feedback, after the assistant turn),
    `done`, and `assistant` (the assistant message as the environment recorded it)."""

    new_messages: list[dict]
    done: bool
    assistant: dict | None = None


def _message_text(value: Any) -> tuple[str, str]:
    """(text, problem) of a message's `content`: a string, None (""), or a list of OpenAI text parts
    (strings or {"type": "text", "text": str}) joined; problem is "" unless the shape is none of these."""
    if value is None:
        return "", ""
    if isinstance(value, str):
        return value, ""
    if isinstance(value, (list, tuple)):
        parts = []
        for part in value:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping) and part.get("type", "text") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                return "", f"content part {part!r} is not a text part"
        return "".join(parts), ""
    return "", f"content must be a string or a list of text parts, got {type(value).__name__}"


class LiveStreamEnv:
    """The episode environment over a `World` (see the module docstring).

    Args:
      world: the catalog the tools run over (None with a `tool_runner` that does not need it, e.g. one that
        calls a remote MCP tool server).
      config: limits and fault rates.
      tool_runner: executes one call; defaults to the in-process `execute_tool_call` (a deployment
        can pass one that goes over MCP).
    """

    def __init__(self, world: World | None, config: EnvConfig | None = None, tool_runner: ToolRunner | None = None):
        self.world = world
        self.config = config or EnvConfig()
        self._runner = tool_runner or (lambda w, h, name, args, fault: execute_tool_call(w, h, name, args, fault=fault))
        self._task: Task | None = None

    # ------------------------------------------------------------------ lifecycle
    def reset(self, task: Task, harness: HarnessState, seed: int | None = None) -> list[dict]:
        """Starts an episode; returns [system, user] messages (copies).

        Args:
          task: the viewer request.
          harness: the harness in force.
          seed: fault-injection seed; None uses `task.seed`.
        """
        from hat_jax.harness.render import render_system_prompt

        self._task, self._harness = task, harness
        self._seed = task.seed if seed is None else int(seed)
        self._messages: list[dict] = [
            {"role": "system", "content": render_system_prompt(harness)},
            {"role": "user", "content": task.message},
        ]
        self._records: list[ToolCallRecord] = []
        self._loaded: list[str] = []
        self._events: list[tuple[str, str, str]] = []
        self._attempts: Counter[str] = Counter()
        self._round = self._call_index = self._revisions = self._skill_turns = 0
        self._done, self._outcome, self._reply = False, "no_reply", ""
        decision = self._hooks("UserPromptSubmit", HookContext("UserPromptSubmit", harness, reply=task.message))
        if decision is not None and decision.action == "block":
            self._finish("no_reply")
        return copy.deepcopy(self._messages)

    @property
    def done(self) -> bool:
        """Whether the episode has ended."""
        return self._task is not None and self._done

    def step_text(self, text: str) -> StepResult:
        """One assistant turn from raw generated text (reasoning block, reply and/or tool-call blocks)."""
        self._check_running()
        text = text.removesuffix("<|im_end|>")
        reasoning, content = split_reasoning(text)
        try:
            calls = parse_tool_calls(text, self._harness.openai_tools())
        except ValueError as err:
            message = {"role": "assistant", "content": content.strip(), "reasoning_content": reasoning}
            self._messages.append(message)
            self._parse_error = str(err)
            self._finish("malformed")
            return StepResult([], True, copy.deepcopy(message))
        message: dict[str, Any] = {
            "role": "assistant",
            "content": content.split("<tool_call>")[0].strip(),
            "reasoning_content": reasoning,
        }
        if calls:
            message["tool_calls"] = [
                {"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls
            ]
        return self.step(message)

    def step(self, message: Mapping[str, Any]) -> StepResult:
        """One assistant turn given as an OpenAI chat message (`tool_calls` optional).

        `content` (and `reasoning_content`) may be a string, None, or a list of OpenAI text parts
        ({"type": "text", "text": ...} or plain strings), which are joined; `tool_calls` may be absent, None or
        a list. Any other shape (a `tool_calls` string, a numeric `content`, a non-text content part) is a
        malformed turn: it is recorded and ends the episode with outcome "malformed" instead of raising. A list
        entry that is not a call mapping becomes a call of the nameless tool (an "unknown_tool" result), like a
        misspelt name.

        Returns:
          StepResult(new_messages, done, assistant).
        Raises:
          TypeError: `message` is not a mapping (raw generated text goes to `step_text`).
          RuntimeError: no episode was reset, or it already ended.
        """
        if not isinstance(message, Mapping):
            raise TypeError(
                "LiveStreamEnv.step takes an assistant message mapping {'role', 'content', 'tool_calls'?}, "
                f"got {type(message).__name__}; use step_text(text) for raw generated text"
            )
        self._check_running()
        content, bad_content = _message_text(message.get("content"))
        reasoning, bad_reasoning = _message_text(message.get("reasoning_content"))
        raw_calls = message.get("tool_calls")
        assistant: dict[str, Any] = {"role": "assistant", "content": content, "reasoning_content": reasoning}
        problem = bad_content or bad_reasoning
        if raw_calls is not None and not isinstance(raw_calls, (list, tuple)):
            problem = f"tool_calls must be a list of calls, got {type(raw_calls).__name__}"
        if problem:
            self._messages.append(assistant)
            self._parse_error = problem
            self._finish("malformed")
            return StepResult([], True, copy.deepcopy(assistant))
        calls = list(raw_calls or [])
        if calls:
            assistant["tool_calls"] = [self._normalise_call(c) for c in calls]
        self._messages.append(assistant)
        if calls:
            new = self._tool_round(assistant["tool_calls"])
        else:
            new = self._reply_turn(assistant["content"].strip())
        self._messages.extend(new)
        return StepResult(copy.deepcopy(new), self._done, copy.deepcopy(assistant))

    def episode(self) -> Episode:
        """The episode so far (outcome "no_reply" while it has not ended).

        Raises:
          RuntimeError: no episode was reset.
        """
        if self._task is None:
            raise RuntimeError("LiveStreamEnv.episode() called before reset()")
        return Episode(
            task=self._task,
            harness_version=self._harness.version,
            messages=tuple(copy.deepcopy(self._messages)),
            tool_calls=tuple(self._records),
            reply=self._reply,
            loaded_skills=tuple(self._loaded),
            hook_events=tuple(self._events),
            outcome=self._outcome,
            seed=self._seed,
        )

    # ------------------------------------------------------------------ internals
    def _check_running(self) -> None:
        if self._task is None:
            raise RuntimeError("LiveStreamEnv.step() called before reset()")
        if self._done:
            raise RuntimeError(f"LiveStreamEnv.step() called after the episode ended (outcome {self._outcome!r})")

    def _finish(self, outcome: str, reply: str = "") -> None:
        self._done, self._outcome, self._reply = True, outcome, reply

    def _hooks(self, event: str, context: HookContext):
        decisions = run_hooks(self._harness, event, context)
        self._events.extend((event, d.handler, d.outcome) for d in decisions)
        return first_action(decisions)

    @staticmethod
    def _normalise_call(call: Any) -> dict:
        """{"type": "function", "function": {"name", "arguments"}} from an OpenAI call (arguments may be JSON text)."""
        fn = call.get("function", call) if isinstance(call, Mapping) else {}
        arguments = fn.get("arguments", {}) if isinstance(fn, Mapping) else {}
        try:
            arguments = parse_arguments(arguments)
        except json.JSONDecodeError:
            pass  # the executor reports it as invalid arguments
        name = fn.get("name", "") if isinstance(fn, Mapping) else ""
        return {"type": "function", "function": {"name": str(name or ""), "arguments": arguments}}

    def _tool_round(self, calls: list[dict]) -> list[dict]:
        skill_tool = self._harness.skill_tool
        if any(c["function"]["name"] != skill_tool for c in calls):  # a round that only loads skills is free
            if self._round >= self.config.max_tool_rounds:
                self._finish("round_limit")
                return []
            self._round += 1
        elif self._skill_turns >= self.config.max_skill_turns:
            self._finish("round_limit")
            return []
        else:
            self._skill_turns += 1
        return [self._tool_call(c["function"]["name"], c["function"]["arguments"]) for c in calls]

    def _tool_call(self, name: str, arguments: Any) -> dict:
        h, cfg = self._harness, self.config
        self._attempts[name] += 1
        attempt = self._attempts[name]
        surface_args = dict(arguments) if isinstance(arguments, Mapping) else {}
        tool = h.tool(name)
        fault = draw_fault(random.Random(f"fault:{self._seed}:{self._call_index}"), cfg.fault_rates)
        self._call_index += 1
        pre = self._hooks(
            "PreToolUse", HookContext("PreToolUse", h, tool_name=name, attempt=attempt, arguments=surface_args)
        )
        if pre is not None and pre.action == "block":
            ex = ToolExecution("error", error_payload("blocked_by_hook", pre.feedback), {}, tool.impl if tool else "")
            latency = 0.0
        else:
            start = time.perf_counter()
            ex = self._runner(self.world, h, name, arguments, fault)
            latency = time.perf_counter() - start
            if ex.status == "timeout":
                latency = max(latency, cfg.tool_timeout_s)
            elif latency > cfg.tool_timeout_s:
                ex = ToolExecution(
                    "timeout",
                    error_payload("timeout", FAULT_MESSAGES["timeout"], {"timeout_s": cfg.tool_timeout_s}),
                    ex.canonical_args,
                    ex.impl,
                )
            ex = limit_result_size(ex)
        result = dict(ex.result)
        event = "PostToolUseFailure" if ex.status in FAILURE_STATUSES else "PostToolUse"
        ctx = HookContext(
            event, h, tool_name=name, status=ex.status, attempt=attempt, arguments=surface_args, result=result
        )
        decisions = run_hooks(h, event, ctx)
        self._events.extend((event, d.handler, d.outcome) for d in decisions)
        feedback = tool_feedback(decisions)
        if feedback:
            result["hook"] = feedback
        if ex.impl == SKILL_TOOL_IMPL and ex.status == "ok":
            self._loaded.append(ex.result["skill"])
        self._records.append(
            ToolCallRecord(
                round=self._round,
                name=name,
                impl=ex.impl,
                arguments=surface_args,
                canonical_args=dict(ex.canonical_args),
                status=ex.status,
                result=result,
                latency_s=latency,
            )
        )
        return {"role": "tool", "name": name, "content": json.dumps(result, ensure_ascii=False)}

    def _reply_turn(self, reply: str) -> list[dict]:
        if not reply:
            self._finish("no_reply")
            return []
        decision = self._hooks("Stop", HookContext("Stop", self._harness, reply=reply))
        if decision is None or decision.action != "block":
            self._finish("replied", reply)
            return []
        if self._revisions < self.config.max_reply_revisions:
            self._revisions += 1
            return [{"role": "user", "content": hook_message(decision.feedback)}]
        self._finish("no_reply")
        return []
