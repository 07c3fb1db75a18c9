"""HSA name maps, trajectory rewriting, behaviour checks and harness validity checks.

Variant implemented and why: every HSA transform returns the new
harness *and* a `NameMap` (tools, argument paths, skills: old -> new), so a trajectory recorded under
the old harness is rewritten consistently for the new one: tool-call names, argument names and
nesting (by argument path), tool-message names, the skill-tool argument value, the skill content the
skill tool returned (the new body), names mentioned in reasoning, replies, hook feedback and tool
results, and the system prompt (re-rendered from the new harness). Hook parameters are different:
a changed retry count or length limit can change what the agent should do, so `behaviour_changed`
says when the trajectory must be re-rolled by the oracle under the new harness instead.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jsonschema

from hat_jax.harness.state import SKILL_TOOL_IMPL, HarnessState, Tool

Path = tuple[str, ...]
_SKILL_ID = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
_TOOL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")  # as hat_jax.harness.loader
_IDENT_CHARS = "A-Za-z0-9_"


class HSAError(ValueError):
    """A transformed harness is invalid (message names the field), or a rewrite cannot be done."""


@dataclasses.dataclass(frozen=True)
class NameMap:
    """What an HSA transform renamed (missing entries are unchanged).

    Attributes:
      tools: old tool name -> new tool name.
      args: old tool name -> {old argument path -> new argument path} (leaf paths into the surface
        arguments, e.g. ("product_id",) -> ("params", "itemId")).
      skills: old skill id -> new skill id.
    """

    tools: Mapping[str, str] = dataclasses.field(default_factory=dict)
    args: Mapping[str, Mapping[Path, Path]] = dataclasses.field(default_factory=dict)
    skills: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def then(self, later: NameMap) -> NameMap:
        """The map of applying `self` and then `later` (old names of `self` -> new names of `later`)."""
        tools = _chain(self.tools, later.tools)
        skills = _chain(self.skills, later.skills)
        args: dict[str, dict[Path, Path]] = {}
        unrenamed_later = {t for t in later.args if t not in self.tools.values()}
        for old in set(self.args) | set(self.tools) | unrenamed_later:
            first = self.args.get(old, {})
            second = later.args.get(self.tools.get(old, old), {})
            merged = {p0: second.get(p1, p1) for p0, p1 in first.items()}
            merged.update({p1: p2 for p1, p2 in second.items() if p1 not in first.values() and p1 not in merged})
            merged = {a: b for a, b in merged.items() if a != b}
            if merged:
                args[old] = merged
        return NameMap(tools, args, skills)

    def text_map(self) -> dict[str, str]:
        """Names to substitute in free text: tools, skills and identifier-like argument keys."""
        out = dict(self.tools)
        out.update(self.skills)
        for paths in self.args.values():
            for old, new in paths.items():
                if old[-1] != new[-1] and _identifier_like(old[-1]):
                    out.setdefault(old[-1], new[-1])
        return out


def _chain(first: Mapping[str, str], second: Mapping[str, str]) -> dict[str, str]:
    out = {a: second.get(b, b) for a, b in first.items()}
    out.update({b: c for b, c in second.items() if b not in first.values() and b not in out})
    return {a: b for a, b in out.items() if a != b}


def _identifier_like(name: str) -> bool:
    """Argument keys that read as identifiers in text (product_id, itemId), not plain words (region)."""
    return bool(re.search(r"[_.\-0-9]|[a-z][A-Z]", name))


def substitute_names(text: str, mapping: Mapping[str, str]) -> str:
    """Replaces every whole-token occurrence of a mapped name in `text`, all at once.

    A token boundary is any character outside [A-Za-z0-9_-] (a '.' too, unless a name continues after
    it), so Chinese text around a name is fine and "get_price" does not match inside "get_price_v2".
    """
    keys = [k for k in mapping if k and mapping[k] != k]
    if not keys or not text:
        return text
    alternation = "|".join(re.escape(k) for k in sorted(keys, key=len, reverse=True))
    pattern = rf"(?<![{_IDENT_CHARS}.\-])(?:{alternation})(?![{_IDENT_CHARS}\-]|\.[{_IDENT_CHARS}])"
    return re.sub(pattern, lambda m: mapping[m.group(0)], text)


def leaf_paths(schema: Mapping[str, Any], prefix: Path = ()) -> list[Path]:
    """Every leaf argument path of an object schema (nested object properties are walked)."""
    out: list[Path] = []
    for key, sub in (schema.get("properties") or {}).items():
        if isinstance(sub, Mapping) and sub.get("type") == "object" and "properties" in sub:
            out.extend(leaf_paths(sub, prefix + (key,)))
        else:
            out.append(prefix + (key,))
    return out


def resolve_path(schema: Mapping[str, Any], path: Path) -> Mapping[str, Any] | None:
    """The sub-schema at `path` of an object schema, or None if the path does not exist."""
    node: Any = schema
    for key in path:
        props = node.get("properties") if isinstance(node, Mapping) else None
        if not isinstance(props, Mapping) or key not in props:
            return None
        node = props[key]
    return node


def check_harness(h: HarnessState) -> None:
    """Checks what HSA must preserve (fast enough to run on every draw; the loader's full validation
    of transformed harnesses is covered by a dump/load round trip in the tests).

    Checks: unique tool and skill names; skill ids lowercase-hyphen <= 64 chars; tool names as the
    loader's TOOL_NAME_RE; the skill tool exists with impl `SKILL_TOOL_IMPL`; every schema passes
    `Draft202012Validator.check_schema`; every `arg_paths` entry resolves in its schema; every
    `allowed_tools` entry and hook matcher names a tool; a skill-id enum in the skill tool lists
    exactly the skill ids.
    Raises:
      HSAError: the first problem, naming the field.
    """
    names = [t.name for t in h.tools]
    if len(set(names)) != len(names):
        raise HSAError(f"harness {h.version}: duplicate tool names {sorted(n for n in names if names.count(n) > 1)}")
    ids = [s.name for s in h.skills]
    if len(set(ids)) != len(ids):
        raise HSAError(f"harness {h.version}: duplicate skill ids {sorted(n for n in ids if ids.count(n) > 1)}")
    for s in h.skills:
        if not _SKILL_ID.match(s.name) or len(s.name) > 64:
            raise HSAError(f"skills[{s.name!r}].name: expected lowercase-hyphen, at most 64 characters")
        for t in s.allowed_tools:
            if t not in names:
                raise HSAError(f"skills[{s.name!r}].allowed_tools: no tool named {t!r}")
    for t in h.tools:
        if not _TOOL_NAME.match(t.name):
            raise HSAError(f"tools[{t.name!r}].name: expected {_TOOL_NAME.pattern}")
        error = _schema_error(json.dumps(_skeleton(t.input_schema), sort_keys=True))
        if error:
            raise HSAError(f"tools[{t.name!r}].input_schema: invalid JSON Schema: {error}")
        for arg, path in t.arg_paths.items():
            if resolve_path(t.input_schema, tuple(path)) is None:
                raise HSAError(f"tools[{t.name!r}].arg_paths[{arg!r}]: path {tuple(path)} not in the schema")
    skill_tool = h.tool(h.skill_tool)
    if skill_tool is None or skill_tool.impl != SKILL_TOOL_IMPL:
        raise HSAError(f"skill_tool: {h.skill_tool!r} is not a tool with impl {SKILL_TOOL_IMPL!r}")
    for path in leaf_paths(skill_tool.input_schema):
        enum = resolve_path(skill_tool.input_schema, path).get("enum")
        if enum is not None and sorted(enum) != sorted(ids):
            raise HSAError(f"tools[{skill_tool.name!r}].input_schema{list(path)}.enum: {enum} != skill ids {ids}")
    for hook in h.hooks:
        if hook.matcher is not None and hook.matcher not in names:
            raise HSAError(f"hooks[{hook.event}/{hook.handler}].matcher: no tool named {hook.matcher!r}")


def _skeleton(schema: Any) -> Any:
    """The schema with property names, descriptions and string enum values normalised: they cannot affect metaschema
    validity, and normalising them lets `_schema_error` cache across renamed variants."""
    if isinstance(schema, list):
        return [_skeleton(v) for v in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = {k: ("" if k == "description" and isinstance(v, str) else _skeleton(v)) for k, v in schema.items()}
    if isinstance(schema.get("enum"), list):
        out["enum"] = ["" if isinstance(v, str) else v for v in schema["enum"]]
    props = schema.get("properties")
    if isinstance(props, Mapping):
        names = {k: f"p{i}" for i, k in enumerate(props)}
        out["properties"] = {names[k]: _skeleton(v) for k, v in props.items()}
        if isinstance(schema.get("required"), list):
            out["required"] = [names.get(k, k) if isinstance(k, str) else k for k in schema["required"]]
    return out


@functools.lru_cache(maxsize=4096)
def _schema_error(schema_json: str) -> str:
    """The metaschema error of a schema given as JSON text (Draft 2020-12), or "" when it is valid."""
    try:
        jsonschema.Draft202012Validator.check_schema(json.loads(schema_json))
    except jsonschema.SchemaError as err:
        return err.message
    return ""


def _flatten(args: Mapping[str, Any], schema: Mapping[str, Any], prefix: Path = ()) -> dict[Path, Any]:
    """Surface arguments -> {leaf path: value}, descending only where the schema nests objects."""
    out: dict[Path, Any] = {}
    props = schema.get("properties") or {}
    for key, value in args.items():
        sub = props.get(key)
        nested = isinstance(sub, Mapping) and sub.get("type") == "object" and "properties" in sub
        if nested and isinstance(value, Mapping):
            out.update(_flatten(value, sub, prefix + (key,)))
        else:
            out[prefix + (key,)] = value
    return out


def _build(leaves: Mapping[Path, Any], schema: Mapping[str, Any] | None) -> dict[str, Any]:
    """{leaf path: value} -> nested arguments, keys in the schema's property order (others after)."""
    groups: dict[str, Any] = {}
    for path, value in leaves.items():
        if len(path) == 1:
            groups[path[0]] = value
        else:
            groups.setdefault(path[0], {})[path[1:]] = value
    props = (schema or {}).get("properties") or {}
    order = [k for k in props if k in groups] + [k for k in groups if k not in props]
    return {
        k: (
            _build(groups[k], props.get(k))
            if isinstance(groups[k], dict) and all(isinstance(p, tuple) for p in groups[k])
            else groups[k]
        )
        for k in order
    }


def rewrite_arguments(
    arguments: Mapping[str, Any],
    old_tool: Tool | None,
    new_tool: Tool | None,
    paths: Mapping[Path, Path],
    skills: Mapping[str, str],
) -> dict[str, Any]:
    """One tool call's surface arguments under the new harness (see `rewrite_messages`)."""
    leaves = _flatten(arguments, old_tool.input_schema if old_tool else {})
    moved = {paths.get(p, p): v for p, v in leaves.items()}
    if old_tool is not None and old_tool.impl == SKILL_TOOL_IMPL:
        moved = {p: skills.get(v, v) if isinstance(v, str) else v for p, v in moved.items()}
    return _build(moved, new_tool.input_schema if new_tool else None)


def _substitute_json(value: Any, mapping: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        return substitute_names(value, mapping)
    if isinstance(value, list):
        return [_substitute_json(v, mapping) for v in value]
    if isinstance(value, dict):
        return {k: _substitute_json(v, mapping) for k, v in value.items()}
    return value


def _rewrite_tool_result(
    content: str, is_skill: bool, new_h: HarnessState, nm: NameMap, text: Mapping[str, str]
) -> str:
    try:
        data = json.loads(content)
    except (json.JSONDecodeError, TypeError):
        return substitute_names(content, text) if isinstance(content, str) else content
    new = _substitute_json(data, text)
    if is_skill and isinstance(data, dict) and isinstance(data.get("skill"), str) and "content" in data:
        new_id = nm.skills.get(data["skill"], data["skill"])
        skill = new_h.skill(new_id)
        new["skill"] = new_id
        if skill is not None:
            new["content"] = skill.body
    return content if new == data else json.dumps(new, ensure_ascii=False)


def rewrite_messages(
    messages: Sequence[Mapping[str, Any]],
    old_h: HarnessState,
    new_h: HarnessState,
    name_map: NameMap,
    *,
    system_prompt: str | Callable[[HarnessState], str] | None = None,
) -> list[dict]:
    """Rewrites a trajectory recorded under `old_h` so that it is the same behaviour under `new_h`.

    Args:
      messages: OpenAI-format messages (`hat_jax.sim.types`), arguments as dicts.
      old_h, new_h: the harness before and after HSA; `name_map` maps the first to the second.
      system_prompt: the new system prompt text, or a function of the new harness that renders it;
        None uses `hat_jax.harness.render.render_system_prompt`. Only used when messages[0] is a
        system message.
    Returns:
      new message dicts (the input is not modified): tool-call names, argument names and nesting
      (leaf paths through `name_map.args`, keys in the new schema's order), skill-tool argument values
      and tool-message names mapped; skill-tool results carry the new id and the new body; names in
      reasoning, replies, hook feedback and tool-result strings substituted (`NameMap.text_map`).
    Raises:
      HSAError: no system prompt renderer is available and messages[0] is a system message.
    """
    text = name_map.text_map()
    out: list[dict] = []
    for i, msg in enumerate(messages):
        m = dict(msg)
        if m.get("role") == "system" and i == 0:
            m["content"] = _system_text(new_h, system_prompt)
        elif m.get("role") == "user":
            m["content"] = substitute_names(m.get("content", ""), text) if _is_feedback(m) else m.get("content", "")
        elif m.get("role") == "assistant":
            for key in ("content", "reasoning_content"):
                if isinstance(m.get(key), str):
                    m[key] = substitute_names(m[key], text)
            if m.get("tool_calls"):
                m["tool_calls"] = [_rewrite_call(c, old_h, new_h, name_map) for c in m["tool_calls"]]
        elif m.get("role") == "tool":
            old_name = m.get("name", "")
            m["name"] = name_map.tools.get(old_name, old_name)
            m["content"] = _rewrite_tool_result(
                m.get("content", ""), old_name == old_h.skill_tool, new_h, name_map, text
            )
        out.append(m)
    return out


def _is_feedback(msg: Mapping[str, Any]) -> bool:
    try:
        from hat_jax.harness.hooks import HOOK_FEEDBACK_PREFIX
    except ImportError:  # pragma: no cover - H1's module exists in the full tree
        return False
    return isinstance(msg.get("content"), str) and msg["content"].startswith(HOOK_FEEDBACK_PREFIX)


def _rewrite_call(call: Mapping[str, Any], old_h: HarnessState, new_h: HarnessState, nm: NameMap) -> dict:
    call = dict(call)
    fn = dict(call.get("function", call))
    old_name = fn.get("name", "")
    new_name = nm.tools.get(old_name, old_name)
    args = fn.get("arguments") or {}
    if isinstance(args, str):
        args = json.loads(args)
    fn["name"] = new_name
    fn["arguments"] = rewrite_arguments(
        args, old_h.tool(old_name), new_h.tool(new_name), nm.args.get(old_name, {}), nm.skills
    )
    if "function" in call:
        call["function"] = fn
        return call
    return fn


def _system_text(new_h: HarnessState, system_prompt: str | Callable[[HarnessState], str] | None) -> str:
    if isinstance(system_prompt, str):
        return system_prompt
    if system_prompt is None:
        try:
            from hat_jax.harness.render import render_system_prompt
        except ImportError as err:
            raise HSAError("rewrite_messages: pass system_prompt= (hat_jax.harness.render is not available)") from err
        system_prompt = render_system_prompt
    return system_prompt(new_h)


def _hook_params(h: HarnessState, handler: str) -> list[Mapping[str, Any]]:
    return [dict(k.params) for k in h.hooks if k.handler == handler]


def final_reply(messages: Sequence[Mapping[str, Any]]) -> str | None:
    """The last assistant turn's public text when it calls no tool, else None."""
    for m in reversed(messages):
        if m.get("role") == "assistant":
            return None if m.get("tool_calls") else str(m.get("content") or "")
    return None


def behaviour_changed(
    old_h: HarnessState, new_h: HarnessState, messages: Sequence[Mapping[str, Any]] | None = None
) -> bool:
    """True when the hook/limit changes from `old_h` to `new_h` mean the trajectory must be re-rolled.

    Without `messages`: any change of hook handlers/parameters (matchers excepted: renames) or of a
    "max_chars" constraint. With `messages` (the recorded trajectory), only changes that bite:
    - retry hooks changed and some tool result in the trajectory failed (a JSON result with an
      "error" or "hook" key, or a hook feedback), since the number of retries allowed differs;
    - the length limit (min over reply_length_limit max_chars and "max_chars" constraints) is now
      below the final reply's length (len(reply.strip())), or the hooks changed otherwise.
    """

    def limits(h: HarnessState) -> list[int]:
        vals = [int(p["max_chars"]) for p in _hook_params(h, "reply_length_limit") if "max_chars" in p]
        return vals + [int(c.kwargs["n"]) for c in h.constraints() if c.id == "max_chars" and "n" in c.kwargs]

    def others(h: HarnessState) -> list:
        return [
            (k.event, k.handler, sorted(k.params.items(), key=str))
            for k in h.hooks
            if k.handler not in ("retry_on_tool_error", "reply_length_limit")
        ]

    retry_changed = _hook_params(old_h, "retry_on_tool_error") != _hook_params(new_h, "retry_on_tool_error")
    length_changed = _hook_params(old_h, "reply_length_limit") != _hook_params(new_h, "reply_length_limit") or (
        limits(old_h) != limits(new_h)
    )
    if others(old_h) != others(new_h):
        return True
    if messages is None:
        return retry_changed or length_changed
    if retry_changed and _had_failure(messages):
        return True
    if length_changed:
        reply = final_reply(messages)
        new_limit = min(limits(new_h), default=None)
        return reply is None or (new_limit is not None and len(reply.strip()) > new_limit)
    return False


def _had_failure(messages: Sequence[Mapping[str, Any]]) -> bool:
    for m in messages:
        if m.get("role") == "user" and _is_feedback(m):
            return True
        if m.get("role") == "tool":
            try:
                data = json.loads(m.get("content", ""))
            except (json.JSONDecodeError, TypeError):
                continue
            if isinstance(data, dict) and ("error" in data or "hook" in data):
                return True
    return False
