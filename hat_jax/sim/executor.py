"""Executing one model tool call against the world under a harness (`execute_tool_call`).

The executor is the seam between the surface a model sees and the world: it looks the surface name
up in the harness, validates the surface arguments with `jsonschema` (draft 2020-12) against the
tool's `input_schema`, maps them to canonical arguments with `Tool.arg_paths`, and runs the bound
world function (`hat_jax.sim.tools`), the skill loader, or a distractor. Every model mistake becomes
a structured result, never an exception:

    {"error": {"type": <status or ToolError kind>, "message": <Chinese, naming the English field>,
               "details": {...}}}

Statuses (`hat_jax.sim.types.ToolStatus`): "unknown_tool" (no such surface name, or a name that is
not a string; details list the available tools), "invalid_arguments" (schema failures, or a world
function's own argument check such as an empty search query; details.errors = [{"path",
"message"}], path dotted in surface names), "error" (a `ToolError` from the world, an unknown skill,
an injected error fault, a tool schema the validator cannot evaluate (type "invalid_schema", e.g. a
`$ref` that resolves nowhere in a harness built in code), or an unexpected exception inside a world
function (type "internal_error", logged with its traceback)), "timeout" and "empty" (injected
faults), "ok".

`execute_tool_call` never raises on model input, whatever the name and arguments: the only
exception it raises is `ValueError` for a bad `fault` (a caller bug).

Faults are drawn by the caller (`draw_fault`) and applied only to calls that passed validation
(a model's own mistake is reported as such). The skill loader is never faulted: it is part of the
harness, not a remote service.

Skill loading returns {"skill": name, "content": body}, the skill id read as `skill_argument` says.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Mapping
from typing import Any, NamedTuple

import jsonschema

from hat_jax.harness.state import DISTRACTOR_PREFIX, SKILL_TOOL_IMPL, HarnessState, Tool
from hat_jax.sim.catalog import World
from hat_jax.sim.tools import WORLD_FUNCTIONS, ToolError, call_world_function

FAULTS: tuple[str, ...] = ("error", "timeout", "empty")
FAULT_MESSAGES = {
    "error": "工具服务暂时不可用（service error），请稍后重试",
    "timeout": "工具调用超时（timeout），未返回结果",
}
SKILL_ARG = "skill"  # canonical argument name of the skill loader

log = logging.getLogger(__name__)


class ToolExecution(NamedTuple):
    """The outcome of one call: `status` (ToolStatus), `result` (the JSON payload the model sees),
    `canonical_args` ({} when the call never reached the world), `impl` ("" for an unknown tool)."""

    status: str
    result: dict
    canonical_args: dict
    impl: str


MAX_RESULT_CHARS = 32_000   # a tool result longer than this (as JSON text) is replaced by a result_too_large error


def limit_result_size(ex: ToolExecution, limit: int = MAX_RESULT_CHARS) -> ToolExecution:
    """`ex` unchanged when its result's JSON text has at most `limit` characters, else an "error" execution
    with a `result_too_large` payload naming both sizes (the oversized result never reaches the model)."""
    size = len(json.dumps(ex.result, ensure_ascii=False, default=str))
    if size <= limit:
        return ex
    message = f"工具结果过大（result too large）：{size} 个字符，上限 {limit} 个字符"
    return ToolExecution("error", error_payload("result_too_large", message, {"chars": size, "limit": limit}),
                         ex.canonical_args, ex.impl)


def error_payload(kind: str, message: str, details: Mapping[str, Any] | None = None) -> dict:
    """The structured error result {"error": {"type", "message", "details"}}."""
    return {"error": {"type": kind, "message": message, "details": dict(details or {})}}


def check_fault_rates(rates: Any, field: str = "fault_rates") -> dict[str, float]:
    """`rates` checked: a mapping from fault kinds (`FAULTS`) to probabilities summing to <= 1.

    Args:
      rates: the mapping to check.
      field: its name in error messages (e.g. "EnvConfig.fault_rates").
    Returns:
      a plain dict of floats.
    Raises:
      ValueError: not a mapping, a key outside FAULTS, a value that is not a real number in [0, 1]
        (NaN, strings and booleans included), or rates summing above 1.
    """
    if not isinstance(rates, Mapping):
        raise ValueError(f"{field}: expected a mapping fault kind -> probability, got {type(rates).__name__}")
    unknown = [k for k in rates if k not in FAULTS]
    if unknown:
        raise ValueError(f"{field}: unknown fault kind {unknown[0]!r}; expected keys among {FAULTS}")
    out = {}
    for kind, rate in rates.items():
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 <= rate <= 1.0:
            raise ValueError(f"{field}[{kind!r}] = {rate!r}: expected a probability, a number in [0, 1]")
        out[kind] = float(rate)
    if sum(out.values()) > 1 + 1e-9:
        raise ValueError(f"{field} must sum to <= 1, got {out} (sum {sum(out.values()):g})")
    return out


def draw_fault(rng: random.Random, rates: Mapping[str, float]) -> str | None:
    """Draws one fault: "error", "timeout" or "empty" with probabilities `rates`, else None.

    One uniform draw is compared with the cumulative rates in the order of `FAULTS`.

    Raises:
      ValueError: rates that fail `check_fault_rates`.
    """
    rates = check_fault_rates(rates)
    u = rng.random()
    acc = 0.0
    for fault in FAULTS:
        acc += float(rates.get(fault, 0.0))
        if u < acc:
            return fault
    return None


_MISSING = object()


def _get_path(arguments: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = arguments
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return _MISSING
        node = node[key]
    return node


def canonical_arguments(tool: Tool, arguments: Mapping[str, Any]) -> dict:
    """Maps surface arguments to canonical ones with `tool.arg_paths`.

    Without arg_paths, top-level arguments whose names are canonical argument names of the bound
    world function are taken as they are. Surface arguments outside the paths are dropped.
    """
    if tool.arg_paths:
        out = {}
        for canon, path in tool.arg_paths.items():
            value = _get_path(arguments, tuple(path))
            if value is not _MISSING:
                out[canon] = value
        return out
    fn = WORLD_FUNCTIONS.get(tool.impl)
    names = set(fn.input_schema["properties"]) if fn else set(arguments)
    return {k: v for k, v in arguments.items() if k in names}


class _BrokenSchema(Exception):
    """The tool's own schema could not be evaluated (unresolvable `$ref`, bad regex, ...)."""


def _schema_errors(schema: Mapping[str, Any], arguments: Any) -> list[dict]:
    """Schema failures of `arguments` as [{"path", "message"}], sorted by path.

    Raises:
      _BrokenSchema: the validator itself failed (any exception while evaluating the schema: a
        `$ref` pointing nowhere, an invalid regex, runaway recursion, ...). That is the harness's
        fault, never the model's, and the caller reports it as a structured error.
    """
    try:
        validator_cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        errors = sorted(validator_cls(schema).iter_errors(arguments), key=lambda e: [str(p) for p in e.absolute_path])
        return [{"path": ".".join(map(str, e.absolute_path)) or "(root)", "message": e.message} for e in errors]
    except Exception as err:  # noqa: BLE001 - schema machinery errors of every kind
        raise _BrokenSchema(f"{type(err).__name__}: {err}") from err


def skill_argument(tool: Tool, arguments: Mapping[str, Any]) -> Any:
    """The skill id of a skill-loader call: the canonical argument "skill" (`Tool.arg_paths["skill"]`, None when
    the call lacks it); when the skill tool has no such path, its only string property; failing that, the only
    string value among the arguments (None when there is none or several)."""
    if SKILL_ARG in tool.arg_paths:
        value = _get_path(arguments, tuple(tool.arg_paths[SKILL_ARG]))
        return None if value is _MISSING else value
    strings = [
        k
        for k, v in tool.input_schema.get("properties", {}).items()
        if isinstance(v, Mapping) and v.get("type") == "string"
    ]
    if len(strings) == 1:
        return arguments.get(strings[0])
    values = [v for v in arguments.values() if isinstance(v, str)]
    return values[0] if len(values) == 1 else None


def parse_arguments(arguments: Any) -> Any:
    """A call's arguments as written: a JSON string's value ({} for a blank string), anything else as given.

    Raises:
      json.JSONDecodeError: a string that is not JSON (the executor reports it as "invalid_arguments").
    """
    return (json.loads(arguments) if arguments.strip() else {}) if isinstance(arguments, str) else arguments


def validate_tool_call(harness: HarnessState, name: Any, arguments: Any) -> ToolExecution | None:
    """The failed execution of a call the harness refuses before any world work, else None.

    The checks `execute_tool_call` makes first, in its order: the surface name must name a tool of `harness`
    ("unknown_tool", details list the available tools), the arguments must be a JSON object (a JSON string is
    parsed) that passes the tool's `input_schema` ("invalid_arguments", details.errors), and the schema must be
    evaluable ("error", type "invalid_schema"). Needs no world, so a data pipeline can write the exact result a
    misread call gets (`hat_jax.data.recovery`).

    Args:
      harness: the harness in force. name: the surface tool name written. arguments: a dict, a JSON string or None.
    Returns:
      ToolExecution of the refusal (result as the model sees it), or None when the call passes every check.
    """
    tool = harness.tool(name) if isinstance(name, str) else None
    if tool is None:
        names = [t.name for t in harness.tools]
        message = f"没有名为 {name!r} 的工具（unknown tool），可用工具：{', '.join(names)}"
        return _failed("unknown_tool", "unknown_tool", message, {"available_tools": names}, {}, "")
    if isinstance(arguments, str):
        try:
            arguments = parse_arguments(arguments)
        except json.JSONDecodeError as err:
            errors = [{"path": "(root)", "message": str(err)}]
            message = f"参数不是合法的JSON（arguments）：{err.msg}"
            return _failed("invalid_arguments", "invalid_arguments", message, {"errors": errors}, {}, tool.impl)
    try:
        errors = _schema_errors(tool.input_schema, {} if arguments is None else arguments)
    except _BrokenSchema as err:
        log.warning("tool %s: its inputSchema cannot be evaluated (%s)", name, err)
        message = f"工具 {name} 的参数定义有误，无法校验参数（invalid schema）：{err}"
        return _failed("error", "invalid_schema", message, {"reason": str(err)}, {}, tool.impl)
    if errors:
        return _invalid(name, errors, {}, tool.impl)
    if not isinstance(arguments, Mapping):  # a schema without "type": "object" let a non-object through
        errors = [{"path": "(root)", "message": f"{arguments!r} is not of type 'object'"}]
        return _invalid(name, errors, {}, tool.impl)
    return None


def execute_tool_call(
    world: World, harness: HarnessState, name: str, arguments: Any, *, fault: str | None = None
) -> ToolExecution:
    """Executes the model's call `name(arguments)` under `harness` (see the module docstring).

    Args:
      world: the catalog.
      harness: the harness in force (surface names, schemas, bindings).
      name: the surface tool name the model wrote.
      arguments: the surface arguments (a dict; a JSON object string is accepted; anything else is
        reported as invalid arguments).
      fault: an injected fault ("error", "timeout", "empty") or None.
    Returns:
      ToolExecution(status, result, canonical_args, impl).
    Raises:
      ValueError: `fault` is not None and not one of FAULTS (a caller bug, not a model mistake).
    """
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"fault must be one of {FAULTS} or None, got {fault!r}")
    rejected = validate_tool_call(harness, name, arguments)
    if rejected is not None:
        return rejected
    tool = harness.tool(name)
    arguments = parse_arguments(arguments) or {}

    if tool.impl == SKILL_TOOL_IMPL:
        skill_name = skill_argument(tool, arguments)
        canonical = {SKILL_ARG: skill_name}
        skill = harness.skill(skill_name) if isinstance(skill_name, str) else None
        if skill is None:
            valid = [s.name for s in harness.skills]
            message = f"没有名为 {skill_name!r} 的技能（unknown skill），可用技能：{', '.join(valid)}"
            return _failed("error", "unknown_skill", message, {"valid_skills": valid}, canonical, tool.impl)
        return ToolExecution("ok", {"skill": skill.name, "content": skill.body}, canonical, tool.impl)

    canonical = canonical_arguments(tool, arguments)
    if fault == "error":
        return _failed("error", "service_error", FAULT_MESSAGES["error"], {}, canonical, tool.impl)
    if fault == "timeout":
        return _failed("timeout", "timeout", FAULT_MESSAGES["timeout"], {}, canonical, tool.impl)
    if fault == "empty":
        return ToolExecution("empty", {}, canonical, tool.impl)
    if not tool.impl.startswith(DISTRACTOR_PREFIX) and tool.impl not in WORLD_FUNCTIONS:
        message = f"工具 {name} 未绑定到任何服务（tool not bound）"
        return _failed("error", "unbound_tool", message, {"impl": tool.impl}, canonical, tool.impl)
    try:
        result = call_world_function(world, tool.impl, canonical)
    except ToolError as err:
        if err.kind != "invalid_arguments":
            return _failed("error", err.kind, err.message, err.details, canonical, tool.impl)
        # canonical paths back to surface paths (ToolError guarantees the errors list's shape)
        errors = [{**e, "path": ".".join(tool.arg_paths.get(e["path"], (e["path"],)))} for e in err.details["errors"]]
        return _invalid(name, errors, canonical, tool.impl)
    except Exception as err:  # noqa: BLE001 - a bug in a world function must not escape to the model's loop
        log.exception("tool %s (%s) raised on canonical arguments %r", name, tool.impl, canonical)
        message = f"工具 {name} 内部错误（internal error）：{type(err).__name__}"
        details = {"exception": f"{type(err).__name__}: {err}"}
        return _failed("error", "internal_error", message, details, canonical, tool.impl)
    return ToolExecution("ok", result, canonical, tool.impl)


def _failed(
    status: str, kind: str, message: str, details: Mapping[str, Any], canonical: dict, impl: str
) -> ToolExecution:
    return ToolExecution(status, error_payload(kind, message, details), canonical, impl)


def _invalid(name: str, errors: list[dict], canonical: dict, impl: str) -> ToolExecution:
    text = "; ".join(f"{e['path']}: {e['message']}" for e in errors)
    message = f"工具 {name} 的参数不合法（invalid arguments）：{text}"
    return _failed("invalid_arguments", "invalid_arguments", message, {"errors": errors}, canonical, impl)
