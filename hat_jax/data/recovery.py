"""Recovery turns for HSA-SFT: a misread call of the original harness, its refusal, and the retry that reads.

Variant implemented and why: under a renamed harness a model that memorised the original one writes the original
argument key or tool name (at tiny scale: `name` or `skill` where the schema says `SkillId`). The HAT report's
HSA-SFT keeps "a small share" of hook-forced retries whole "to teach recovery" (stage 1); its trajectories come
from a teacher that reads, so they hold no misread and nothing to recover from. `insert_misread` writes one into an
HSA-rewritten trajectory: before one call whose surface differs from the original harness's, the same call as the
original harness writes it (the new tool name with the original keys, or, where only the name changed, the
original name), the exact refusal the environment returns for it under the new harness
(`hat_jax.sim.executor.validate_tool_call`, with the PostToolUseFailure hooks' feedback,
`hat_jax.harness.hooks.tool_feedback`), then the original call with a reasoning that names the key or name read
from the refusal. The misread turn has `weight` 0 (OpenAI's fine-tuning format), so the loss mask leaves it out
(`hat_jax.harness.render.generated_spans`): the model learns the retry, never the mistake.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from typing import Any

from hat_jax.harness.hooks import HookContext, first_action, run_hooks, tool_feedback
from hat_jax.harness.state import HarnessState
from hat_jax.sim.executor import canonical_arguments, validate_tool_call
from hat_jax.sim.oracle import surface_of

MISREAD_WEIGHT_KEY = "weight"  # an assistant turn with weight 0 is context, not a target


def _calls(message: Mapping[str, Any]) -> list[dict]:
    return [c["function"] for c in message.get("tool_calls") or ()]


def _world_turn(message: Mapping[str, Any], skill_tool: str) -> bool:
    return any(c["name"] != skill_tool for c in _calls(message))


def _failed(after: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the tool message answering the turn before `after` holds an error or hook feedback."""
    reply = next((m for m in after if m.get("role") == "tool"), None)
    try:
        result = json.loads(reply["content"]) if reply is not None else {}
    except (TypeError, ValueError):
        return True
    return not isinstance(result, Mapping) or "error" in result or "hook" in result


def _keys(arguments: Any) -> set[str]:
    return set(arguments) if isinstance(arguments, Mapping) else set()


def _blocked(h: HarnessState, name: str, attempt: int, arguments: Mapping[str, Any]) -> bool:
    """Whether the PreToolUse hooks block this call (a `tool_call_limit` counts attempts per name)."""
    ctx = HookContext("PreToolUse", h, tool_name=name, attempt=attempt, arguments=dict(arguments))
    decision = first_action(run_hooks(h, "PreToolUse", ctx))
    return decision is not None and decision.action == "block"


def misread_call(old: HarnessState, new: HarnessState, call: Mapping[str, Any]) -> tuple[str, dict, str] | None:
    """How a reader of the original harness `old` writes `call`, a call under the renamed harness `new`.

    Args:
      old, new: the harness before and after HSA (same world bindings: `Tool.impl`, `Tool.arg_paths`' meaning).
      call: {"name": surface name under `new`, "arguments": surface arguments (a dict)}.
    Returns:
      (name, arguments, note): the new tool name with `old`'s argument layout when the layouts differ, else
      `old`'s tool name when only the name differs; note the retry's reasoning naming what the refusal shows.
      None when `old` writes the call as `new` does, or a side has no tool for it.
    """
    tool = new.tool(call["name"])
    if tool is None or not isinstance(call.get("arguments"), Mapping):
        return None
    before = old.tool_by_impl(tool.impl)
    if before is None:
        return None
    arguments = dict(call["arguments"])
    remembered = surface_of(before, canonical_arguments(tool, arguments))
    if remembered != arguments:
        keys = "、".join(k for k in arguments if k not in remembered) or "、".join(arguments)
        return tool.name, remembered, f"参数名应为{keys}，按工具定义重新调用。"
    if before.name != tool.name:
        return before.name, arguments, f"工具名应为{tool.name}，重新调用。"
    return None


def insert_misread(
    messages: Sequence[Mapping[str, Any]],
    old: HarnessState,
    new: HarnessState,
    rng: random.Random,
    *,
    max_tool_rounds: int,
    max_skill_turns: int,
) -> list[dict] | None:
    """`messages` (a trajectory under `new`) with one misread call, its refusal and the retry, or None.

    The call is drawn uniformly (`rng`) among the eligible: a turn with a single call whose `misread_call` exists,
    whose misread the harness refuses ("unknown_tool" or "invalid_arguments") with hooks that answer "retry", whose
    name no other call of the trajectory uses (the retry's own hook feedback is then what the environment gives:
    a success carries no retry feedback), that no PreToolUse hook blocks (the misread nor the retry, one attempt
    later), and whose extra turn fits the environment's limits (`max_tool_rounds`
    world-tool rounds, `max_skill_turns` skill-only turns, counted as `hat_jax.sim.env` counts them).

    Args:
      messages: OpenAI-format messages, tool-call arguments as dicts, each call followed by its tool message.
      old, new: the original harness and the HSA variant the trajectory is written under.
      rng: the draw of the call.
      max_tool_rounds, max_skill_turns: the environment's limits (`hat_jax.sim.env.EnvConfig`).
    Returns:
      new message dicts (inputs unchanged): the misread assistant turn (`weight` 0, the retry's reasoning
      withheld: it is the original turn's), its tool message (the refusal as JSON text, the hook feedback under
      "hook"), then the original turn with the note prepended to its reasoning. None when no call is eligible.
    """
    out = [dict(m) for m in messages]
    skill_tool = new.skill_tool
    assistant = [m for m in out if m.get("role") == "assistant" and m.get("tool_calls")]
    world_rounds = sum(_world_turn(m, skill_tool) for m in assistant)
    skill_turns = len(assistant) - world_rounds
    names = [c["name"] for m in assistant for c in _calls(m)]
    eligible = []
    for i, m in enumerate(out):
        calls = _calls(m) if m.get("role") == "assistant" else []
        if len(calls) != 1 or names.count(calls[0]["name"]) != 1:
            continue
        if _failed(out[i + 1 :]):  # its recorded failure feedback was written for attempt 1
            continue
        if _world_turn(m, skill_tool) and world_rounds >= max_tool_rounds:
            continue
        if not _world_turn(m, skill_tool) and skill_turns >= max_skill_turns:
            continue
        misread = misread_call(old, new, calls[0])
        if misread is None:
            continue
        name, arguments, note = misread
        refused = validate_tool_call(new, name, arguments)
        if refused is None or refused.status not in ("unknown_tool", "invalid_arguments"):
            continue
        attempt = 1 + sum(c["name"] == name for m_ in out[:i] for c in _calls(m_))
        retried = 1 + sum(c["name"] == calls[0]["name"] for m_ in out[:i] for c in _calls(m_)) + (name == calls[0]["name"])
        if _blocked(new, name, attempt, arguments) or _blocked(new, calls[0]["name"], retried, calls[0]["arguments"]):
            continue
        result = dict(refused.result)
        ctx = HookContext("PostToolUseFailure", new, tool_name=name, status=refused.status, attempt=attempt,
                          arguments=dict(arguments), result=result)
        decisions = run_hooks(new, "PostToolUseFailure", ctx)
        action = first_action(decisions)
        if action is None or action.action != "retry":
            continue
        feedback = tool_feedback(decisions)
        if feedback:
            result["hook"] = feedback
        eligible.append((i, name, arguments, note, result))
    if not eligible:
        return None
    i, name, arguments, note, result = eligible[rng.randrange(len(eligible))]
    turn = out[i]
    wrong = {
        "role": "assistant",
        "content": "",
        "reasoning_content": turn.get("reasoning_content", ""),
        "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}],
        MISREAD_WEIGHT_KEY: 0,
    }
    refusal = {"role": "tool", "name": name, "content": json.dumps(result, ensure_ascii=False)}
    retry = {**turn, "reasoning_content": note + str(turn.get("reasoning_content", ""))}
    return [*out[:i], wrong, refusal, retry, *out[i + 1:]]
