"""The deployed agent loop: one viewer message -> harness -> streamed model turns and MCP tool rounds -> reply.

Variant implemented and why:
- the episode logic is the simulator's own `LiveStreamEnv` (system prompt rendered from the harness,
  UserPromptSubmit / PreToolUse / PostToolUse(Failure) / Stop hooks, retry advice in tool results,
  at most `max_tool_rounds` world-tool rounds, skill-only turns capped separately, one revision of a
  reply a Stop hook blocks), so deployment applies hooks exactly as training and evaluation did;
  only the tool runner differs: calls go to the real MCP tool server through
  `hat_jax.sim.mcp_client` (any object with `call_tool(name, arguments, timeout_s)`);
- each model turn is one streamed chat completion (`chat_stream.ChatStreamClient`) with the
  harness's tools in the request; tool calls are taken from the server's parsed `tool_calls` when it
  sends them, else parsed from the `<tool_call>` text ourselves (`LiveStreamEnv.step_text`), so
  the loop works whether or not the server runs a tool parser;
- fallbacks, the HAT report's release guardrails: the first tool call may take 3 s, later ones 2 s,
  the whole trajectory 10 s (`AgentConfig`); every model call and tool call gets at most what is
  left of the budget. A tool timeout or error goes back to the model as the tool's error result
  (with the harness's retry hook), as in the simulator. The request *fails* when the model endpoint
  fails (HTTP error, connect error, stall, malformed or broken stream), a turn is *empty* (no
  content, no reasoning and no tool call: failure "empty_turn", so a server that returns nothing never
  counts as a success), a turn is cut by `max_tokens`, the output cannot be parsed, tools are asked
  for after the last round, the tool server is gone, or the budget runs out; a failed request publishes the conservative reply
  (`on_failure="conservative"`) or nothing (`"silent"`), recorded as outcome "fallback_reply" /
  "no_reply" with the failure kind. A reply the Stop hooks still block after the revision is
  withheld by the harness itself: outcome "no_reply", not a failure.
- execution success (Table 7) = the request completed without a failure; it says nothing about
  whether the answer is correct.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping
from typing import Any, Literal, Protocol

from hat_jax.harness.state import HarnessState
from hat_jax.sim.catalog import World
from hat_jax.sim.env import EnvConfig, LiveStreamEnv
from hat_jax.sim.executor import FAULT_MESSAGES, ToolExecution, error_payload
from hat_jax.sim.policy import to_openai_messages
from hat_jax.sim.types import Task
from hat_jax.tokenizer import split_reasoning

from hat_jax.deploy.chat_stream import ChatStreamClient, StreamResult

# Says it cannot confirm right now, points to the product page, claims nothing (passes the
# production harness's Stop hooks; `hat_jax.judges.phrases.is_conservative` recognises it).
CONSERVATIVE_REPLY = "宝宝，这个信息暂时查不到，系统有点忙，稍后再问我或以商品详情页为准哦。"
OUTCOMES = ("replied", "fallback_reply", "no_reply")  # what the viewer got
TOOL_FAILURES = ("error", "timeout", "empty", "invalid_arguments", "unknown_tool")


class ToolCaller(Protocol):
    """What the loop needs from a tool client (`hat_jax.sim.mcp_client.SyncToolClient` fits)."""

    def call_tool(self, name: str, arguments: Mapping[str, Any] | None, timeout_s: float) -> Any: ...


@dataclasses.dataclass(frozen=True)
class AgentConfig:
    """Limits and fallbacks of one agent request (seconds; defaults from the paper's guardrails).

    Attributes:
      max_tool_rounds: world-tool rounds allowed (the paper: 4).
      first_tool_timeout_s, tool_timeout_s: timeout of the first tool call and of later ones.
      trajectory_budget_s: the whole request, from the viewer's message to the final answer.
      on_failure: "conservative" (publish `conservative_reply`) or "silent" (publish nothing).
      conservative_reply: the fallback text.
      send_reasoning: send past assistant reasoning back to the server.
    """

    max_tool_rounds: int = 4
    first_tool_timeout_s: float = 3.0
    tool_timeout_s: float = 2.0
    trajectory_budget_s: float = 10.0
    on_failure: Literal["conservative", "silent"] = "conservative"
    conservative_reply: str = CONSERVATIVE_REPLY
    send_reasoning: bool = False

    def __post_init__(self) -> None:
        for name in ("first_tool_timeout_s", "tool_timeout_s", "trajectory_budget_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise ValueError(f"AgentConfig.{name} must be a finite number > 0, got {value!r}")
        if isinstance(self.max_tool_rounds, bool) or not isinstance(self.max_tool_rounds, int) or self.max_tool_rounds < 1:
            raise ValueError(f"AgentConfig.max_tool_rounds must be an int >= 1, got {self.max_tool_rounds!r}")
        if self.on_failure not in ("conservative", "silent"):
            raise ValueError(f"AgentConfig.on_failure must be 'conservative' or 'silent', got {self.on_failure!r}")


@dataclasses.dataclass
class AgentResult:
    """One request as the replay records it (times in seconds from the viewer's message).

    Attributes:
      request_id, intent: the request (suite item id) and its viewer intent.
      wall_s: to the final answer (reply, fallback or the decision to stay silent).
      ttft_token_s: to the first generated token of any kind (reasoning, content or tool call).
      ttft_reply_s: to the first character of the published model reply (None if none).
      first_chunk_s: to the first SSE event of any kind.
      success: completed without a failure (not: correct).
      outcome: "replied", "fallback_reply" or "no_reply".
      failure: None or the failure kind (module docstring), `detail` the message.
      env_outcome: the episode outcome of `LiveStreamEnv`.
      rounds, model_turns: world-tool rounds used, streamed model turns.
      completion_tokens: generated tokens over all turns; `decode_tokens` / `decode_s` the tokens
        after each turn's first and the time they took (for decode tokens/s).
      tool_calls: [{"name", "status", "latency_s", "timeout_s"}]; tool_failures: calls not "ok".
      reply: the published text ("" when silent).
    """

    request_id: str
    intent: str = ""
    wall_s: float = 0.0
    ttft_token_s: float | None = None
    ttft_reply_s: float | None = None
    first_chunk_s: float | None = None
    success: bool = False
    outcome: str = "no_reply"
    failure: str | None = None
    detail: str = ""
    env_outcome: str = ""
    rounds: int = 0
    model_turns: int = 0
    completion_tokens: int = 0
    decode_tokens: int = 0
    decode_s: float = 0.0
    tool_calls: list[dict] = dataclasses.field(default_factory=list)
    tool_failures: int = 0
    reply: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The record as plain JSON data (times rounded to microseconds)."""
        out = dataclasses.asdict(self)
        for key, value in out.items():
            if isinstance(value, float):
                out[key] = round(value, 6)
        return out


class McpToolRunner:
    """A `LiveStreamEnv` tool runner that calls the tool server with the fallback timeouts.

    Args:
      client: the tool client; deadline: `time.perf_counter()` end of the trajectory budget;
      config: the timeouts.
    Attributes (after the episode): records (one dict per call), server_down (a transport error
    was seen: the tool server is gone).
    """

    def __init__(self, client: ToolCaller, deadline: float, config: AgentConfig):
        self.client, self.deadline, self.config = client, deadline, config
        self.records: list[dict] = []
        self.server_down = ""

    def __call__(self, world: Any, harness: HarnessState, name: str, arguments: Any, fault: str | None) -> ToolExecution:
        tool = harness.tool(name)
        impl = tool.impl if tool else ""
        limit = self.config.first_tool_timeout_s if not self.records else self.config.tool_timeout_s
        timeout = min(limit, self.deadline - time.perf_counter())
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError:
                pass
        if self.server_down or timeout <= 0:
            status, latency = ("error" if self.server_down else "timeout"), 0.0
            message = self.server_down or "trajectory budget exhausted"
            ex = ToolExecution(status, error_payload(status, FAULT_MESSAGES[status], {"reason": message}), {}, impl)
        elif not isinstance(arguments, Mapping):
            errors = [{"path": "(root)", "message": f"{arguments!r} is not of type 'object'"}]
            payload = error_payload("invalid_arguments", "参数不是合法的JSON对象（arguments）", {"errors": errors})
            ex, latency = ToolExecution("invalid_arguments", payload, {}, impl), 0.0
        else:
            ex, latency = self._call(name, dict(arguments), timeout, impl)
        self.records.append(
            {"name": name, "status": ex.status, "latency_s": round(latency, 6), "timeout_s": round(timeout, 6)}
        )
        return ex

    def _call(self, name: str, arguments: dict, timeout: float, impl: str) -> tuple[ToolExecution, float]:
        out = self.client.call_tool(name, arguments, timeout)
        if out.status == "transport_error":
            self.server_down = f"tool server unreachable: {out.result}"
            return ToolExecution("error", error_payload("error", FAULT_MESSAGES["error"], {}), {}, impl), out.latency_s
        if out.status == "timeout":
            payload = error_payload("timeout", FAULT_MESSAGES["timeout"], {"timeout_s": round(timeout, 3)})
            return ToolExecution("timeout", payload, {}, impl), out.latency_s
        result = out.result if isinstance(out.result, dict) else {"result": out.result}
        status = "ok" if out.status == "ok" else (out.tool_status if out.tool_status in TOOL_FAILURES else "error")
        return ToolExecution(status, result, dict(out.canonical_args), out.impl or impl), out.latency_s


def is_empty_turn(res: StreamResult) -> bool:
    """True when a completed stream produced nothing: no content, no reasoning (whitespace only) and no tool call.

    Distinct from a reply a Stop hook withholds (the model wrote one; the harness kept it from the viewer).
    """
    return not (res.content.strip() or res.reasoning.strip() or res.tool_calls)


def _assistant_message(res: StreamResult) -> dict | None:
    """The turn as an assistant message when the server parsed tool calls, else None (parse the text)."""
    if not res.tool_calls:
        return None
    reasoning, content = split_reasoning(res.content)
    calls = [{"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}} for c in res.tool_calls]
    return {"role": "assistant", "content": content.split("<tool_call>")[0].strip(),
            "reasoning_content": (res.reasoning + reasoning).strip(), "tool_calls": calls}  # fmt: skip


def _reply_offset(content: str) -> int:
    """Characters of `content` before the reply text starts (after any `</think>` and whitespace)."""
    idx = content.rfind("</think>")
    start = idx + len("</think>") if idx >= 0 else 0
    return start + len(content[start:]) - len(content[start:].lstrip())


def run_agent(
    task: Task,
    harness: HarnessState,
    llm: ChatStreamClient,
    tools: ToolCaller,
    config: AgentConfig = AgentConfig(),
    world: World | None = None,
    request_id: str | None = None,
) -> AgentResult:
    """Answers one viewer message with the full agent loop; never raises for server or tool failures.

    Args:
      task: the request (only `task.message` reaches the model; ground truth is never sent).
      harness: the harness in force (prompt, tools, hooks).
      llm: the streaming model client.
      tools: the MCP tool client.
      config: limits and fallbacks.
      world: passed through to `LiveStreamEnv` (unused by the MCP runner; may be None).
      request_id: recorded id (default `task.task_id`).
    Returns:
      the `AgentResult` (module docstring for outcomes and failures).
    """
    start = time.perf_counter()
    deadline = start + config.trajectory_budget_s
    runner = McpToolRunner(tools, deadline, config)
    env_config = EnvConfig(
        max_tool_rounds=config.max_tool_rounds, tool_timeout_s=max(config.first_tool_timeout_s, config.tool_timeout_s)
    )
    env = LiveStreamEnv(world, env_config, tool_runner=runner)
    rec = AgentResult(request_id=request_id or str(task.task_id), intent=task.intent)
    messages = env.reset(task, harness)
    openai_tools = harness.openai_tools()
    while not env.done:
        offset = time.perf_counter() - start
        res = llm.stream_chat(to_openai_messages(messages, send_reasoning=config.send_reasoning), openai_tools, deadline)
        _count_turn(rec, res, offset)
        if failure := _turn_failure(res, rec.model_turns):
            rec.failure, rec.detail = failure
            break
        message = _assistant_message(res)
        if message is not None:
            step = env.step(message)
        else:
            text = f"{res.reasoning}\n</think>\n\n{res.content}" if res.reasoning else res.content
            step = env.step_text(text)
        messages = [*messages, step.assistant, *step.new_messages]
        if env.done and env.episode().outcome == "replied":
            reply_at = res.time_content_reaches(_reply_offset(res.content))
            rec.ttft_reply_s = None if reply_at is None else offset + reply_at
        if runner.server_down:
            rec.failure, rec.detail = "tool_server_down", runner.server_down
            break
        if not env.done and time.perf_counter() >= deadline:
            rec.failure = "budget_exhausted"
            rec.detail = f"{config.trajectory_budget_s:g} s spent after {rec.model_turns} turns"
            break
    _settle_outcome(rec, env, runner.records, config)
    rec.wall_s = time.perf_counter() - start
    return rec


def _count_turn(rec: AgentResult, res: StreamResult, offset: float) -> None:
    """Adds one model turn's tokens and decode time to `rec`; the first chunk and token times of the first turn
    that has them (`offset`: seconds from the request to this turn's start)."""
    rec.model_turns += 1
    rec.completion_tokens += res.completion_tokens
    tokens, seconds = res.decode
    rec.decode_tokens, rec.decode_s = rec.decode_tokens + tokens, rec.decode_s + seconds
    if rec.first_chunk_s is None and res.t_first_chunk is not None:
        rec.first_chunk_s = offset + res.t_first_chunk
    if rec.ttft_token_s is None and res.t_first_token is not None:
        rec.ttft_token_s = offset + res.t_first_token


def _turn_failure(res: StreamResult, turn: int) -> tuple[str, str] | None:
    """(failure, detail) when model turn `turn` ends the request: a failed stream, max_tokens, or an empty turn."""
    if not res.ok:
        return ("budget_exhausted" if res.status == "timeout" else f"llm_{res.status}"), res.error
    if res.finish_reason == "length":
        return "truncated", f"turn {turn} hit max_tokens ({res.completion_tokens} tokens)"
    if is_empty_turn(res):
        return "empty_turn", (f"turn {turn}: the model stream had no content, no reasoning and no tool call "
                              f"(finish_reason {res.finish_reason!r})")
    return None


def _settle_outcome(rec: AgentResult, env: LiveStreamEnv, tool_records: list[dict], config: AgentConfig) -> None:
    """Fills `rec`'s outcome, reply, rounds and tool counts from the episode once the loop has ended."""
    episode = env.episode()
    rec.env_outcome = episode.outcome if env.done else "cut"
    if rec.failure is None and episode.outcome in ("round_limit", "malformed"):
        rec.failure = "round_limit" if episode.outcome == "round_limit" else "malformed_output"
        rec.detail = ("model output is neither a reply nor well-formed tool calls" if episode.outcome == "malformed"
                      else "tools requested after the last round")
    rec.rounds = max((c.round for c in episode.tool_calls), default=0)
    rec.tool_calls = tool_records
    rec.tool_failures = sum(1 for c in tool_records if c["status"] != "ok")
    if rec.failure is None:
        rec.success = True
        rec.outcome, rec.reply = ("replied", episode.reply) if episode.outcome == "replied" else ("no_reply", "")
    elif config.on_failure == "conservative":
        rec.outcome, rec.reply, rec.ttft_reply_s = "fallback_reply", config.conservative_reply, None
    else:
        rec.outcome, rec.reply, rec.ttft_reply_s = "no_reply", "", None
