"""Reads and validates harness folders (`harness.yaml` + `skills/<name>/SKILL.md`); `writer` writes them.

Variant implemented and why: the on-disk layout follows the agent ecosystem's conventions (open Agent
Skills `SKILL.md` folders, MCP tool definitions, lifecycle-event hooks), so that a harness written
for a real agent loads as it is and ours read like one:
- `harness.yaml`: `name`, `version`, `family`, `heading_style`, `skill_listing` (name_first, the default, or
  description_first), `skill_tool`, `skills` (folder names,
  in prompt order), `prompt` (sections in order: `key`, `title`, `text`, `constraints: [{id, kwargs}]`),
  `tools` (MCP tool definitions `name`, `description`, `inputSchema`, plus the world binding under
  the extension key `x-hat: {impl, arg_paths}`, so the rest of each entry is a plain MCP tool), and
  `hooks` keyed by lifecycle event: `{Event: [{handler, matcher?, params}]}`;
- `skills/<name>/SKILL.md`: open Agent Skills format, YAML front matter `name` (lowercase-hyphen,
  at most 64 characters, equal to the folder name), `description`, optional `allowed-tools`
  (space-separated surface tool names), `metadata: {hat-skill-key: KEY}` (the world skill), then
  the Markdown body.

Files are read as UTF-8 and parsed with `yaml.safe_load` semantics (plus a duplicate-key check);
nothing in a data file is executed: hooks name handlers from `HOOK_REGISTRY`, constraints name
`CONSTRAINT_REGISTRY` entries, and their parameters are checked against the registered JSON
Schemas. Every problem raises `HarnessError` naming the file, the field path (e.g.
`tools[3].inputSchema.properties.sku_id.type`) and what was expected.

Tool schemas are checked beyond `check_schema` (`hat_jax.harness.schema_checks`). The world a harness
binds to is given, never imported: `WorldBindings` lists the world functions with their canonical
arguments and the world skills (the simulator's are `hat_jax.sim.world_harness.WORLD_BINDINGS`); each
tool's `x-hat` binding (`_load_binding`) and each skill's world skill (`_load_skills`) is checked against it.

Normal form: skill bodies are stripped of surrounding blank lines and hooks are ordered by
`HOOK_EVENTS` (then file order), so `load_harness(dump_harness(h, d), bindings) == h` for every `h` in
normal form (every loaded harness is).
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from hat_jax.harness.constraints import CONSTRAINT_REGISTRY
from hat_jax.harness.hooks import HOOK_REGISTRY
from hat_jax.harness.schema_checks import arg_path_problem, schema_problem
from hat_jax.harness.state import (
    DISTRACTOR_PREFIX,
    HEADING_STYLES,
    HOOK_EVENTS,
    SKILL_LISTINGS,
    SKILL_TOOL_IMPL,
    Constraint,
    HarnessState,
    HookSpec,
    PromptSection,
    Skill,
    Tool,
)

log = logging.getLogger(__name__)

MANIFEST = "harness.yaml"
SKILL_FILE = "SKILL.md"
SKILL_KEY_FIELD = "hat-skill-key"
BINDING_KEY = "x-hat"
MAX_SKILL_BODY_CHARS = 16_000      # a SKILL.md body is sent whole as one tool result when the skill is loaded
SKILL_TOOL_NAME = "skill_tool"     # the one prompt placeholder, {skill_tool} (`hat_jax.harness.render`)
PLACEHOLDER_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
SKILL_TOOL_ARGS = (("skill",), ())  # the skill loader's canonical arguments (required, optional)
JSON_SCHEMA_TYPES: tuple[str, ...] = ("array", "boolean", "integer", "null", "number", "object", "string")
SKILL_NAME_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
TOOL_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
_MANIFEST_KEYS = ("name", "version", "family", "heading_style", "skill_listing", "skill_tool", "skills", "prompt",
                  "tools", "hooks", "description")
_FRONT_MATTER_KEYS = ("name", "description", "allowed-tools", "metadata", "license", "compatibility")


@dataclasses.dataclass(frozen=True)
class WorldBindings:
    """What a harness may bind to, as the world that runs it declares it (`hat_jax.sim.world_harness`).

    Attributes:
      tool_args: world function (a tool's `x-hat.impl`) -> (required, optional) canonical argument names.
      skill_keys: the world skills a skill's `metadata.hat-skill-key` may name.
    """

    tool_args: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]]
    skill_keys: tuple[str, ...]

    def args_of(self, impl: str) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
        """(required, optional) arguments of `impl` (the skill loader's included); None for an unknown impl."""
        return SKILL_TOOL_ARGS if impl == SKILL_TOOL_IMPL else self.tool_args.get(impl)


class HarnessError(ValueError):
    """A malformed harness file: `file`, `field` (path inside it) and what was expected."""

    def __init__(self, file: str | Path, field: str, expected: str):
        self.file, self.field, self.expected = str(file), field, expected
        super().__init__(f"{file}: {field}: {expected}" if field else f"{file}: {expected}")


class _UniqueKeyLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that rejects a key repeated in one mapping."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _read_text(file: Path) -> str:
    """The UTF-8 text of `file`; HarnessError naming it when it is not UTF-8 or cannot be read."""
    try:
        return file.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise HarnessError(
            file, "", f"expected UTF-8 text; byte {err.object[err.start]:#04x} at offset {err.start} is not valid UTF-8"
        ) from None
    except OSError as err:
        raise HarnessError(file, "", f"cannot read the file: {err.strerror or err}") from None


def _read_yaml(text: str, file: Path) -> Any:
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:
        raise HarnessError(file, "", f"invalid YAML: {err}") from err


def _path_str(prefix: str, parts: Sequence[Any]) -> str:
    out = prefix
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


class _Checker:
    """Type checks that raise HarnessError for one file."""

    def __init__(self, file: Path):
        self.file = file

    def fail(self, field: str, expected: str) -> None:
        raise HarnessError(self.file, field, expected)

    def typed(self, value: Any, kind: type | tuple[type, ...], field: str, what: str) -> Any:
        if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
            self.fail(field, f"expected {what}, got {type(value).__name__} {value!r}")
        return value

    def text(self, value: Any, field: str, allow_empty: bool = False) -> str:
        self.typed(value, str, field, "a string")
        if not allow_empty and not value.strip():
            self.fail(field, "expected a non-empty string")
        return value

    def mapping(self, value: Any, field: str) -> Mapping:
        return self.typed(value, dict, field, "a mapping")

    def seq(self, value: Any, field: str) -> list:
        return self.typed(value, list, field, "a list")

    def keys(self, value: Mapping, allowed: Sequence[str], field: str) -> None:
        extra = [k for k in value if k not in allowed]
        if extra:
            self.fail(
                _path_str(field, [extra[0]]) if field else str(extra[0]),
                f"unknown key; expected one of {', '.join(allowed)}",
            )

    def against(self, value: Any, schema: Mapping, field: str) -> None:
        err = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(value))
        if err is not None:
            self.fail(_path_str(field, list(err.absolute_path)), err.message)


def _split_front_matter(text: str, file: Path) -> tuple[dict, str]:
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].strip() != "---":
        raise HarnessError(file, "front matter", "expected the file to start with a '---' line")
    end = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), None)
    if end is None:
        raise HarnessError(file, "front matter", "expected a closing '---' line")
    meta = _read_yaml("".join(lines[1:end]), file)
    if not isinstance(meta, dict):
        raise HarnessError(file, "front matter", f"expected a YAML mapping, got {type(meta).__name__}")
    return meta, "".join(lines[end + 1 :]).strip("\n")


def _load_skill(folder: Path, name: str, field: str, skill_keys: Sequence[str]) -> tuple[Skill, Path]:
    file = folder / "skills" / name / SKILL_FILE
    if not file.is_file():
        raise HarnessError(folder / MANIFEST, field, f"skill folder {name!r} has no {file.relative_to(folder)}")
    meta, body = _split_front_matter(_read_text(file), file)
    c = _Checker(file)
    c.keys(meta, _FRONT_MATTER_KEYS, "")
    got = c.text(meta.get("name"), "name")
    if not SKILL_NAME_RE.match(got) or len(got) > 64:
        c.fail("name", f"expected lowercase letters, digits and single hyphens, at most 64 characters, got {got!r}")
    if got != name:
        c.fail("name", f"expected {name!r} (the folder name), got {got!r}")
    desc = c.text(meta.get("description"), "description")
    if len(desc) > 1024:
        c.fail("description", "expected at most 1024 characters")
    tools_raw = meta.get("allowed-tools", "")
    if isinstance(tools_raw, list):
        allowed = tuple(c.text(t, f"allowed-tools[{i}]") for i, t in enumerate(tools_raw))
    else:
        allowed = tuple(c.text(tools_raw, "allowed-tools", allow_empty=True).split())
    metadata = c.mapping(meta.get("metadata", {}) or {}, "metadata")
    key = metadata.get(SKILL_KEY_FIELD, "")
    if key not in (*skill_keys, ""):
        c.fail(f"metadata.{SKILL_KEY_FIELD}", f"expected one of {', '.join(skill_keys)}, got {key!r}")
    if not body.strip():
        c.fail("body", "expected a non-empty Markdown body after the front matter")
    if len(body) > MAX_SKILL_BODY_CHARS:
        c.fail("body", f"expected at most {MAX_SKILL_BODY_CHARS} characters (the body is sent whole through the "
                       f"skill tool), got {len(body)}")
    return Skill(name=name, description=desc, body=body, allowed_tools=allowed, key=key), file


def _load_tool(raw: Any, field: str, c: _Checker, bindings: WorldBindings) -> Tool:
    c.mapping(raw, field)
    c.keys(raw, ("name", "description", "inputSchema", BINDING_KEY), field)
    name = c.text(raw.get("name"), f"{field}.name")
    if not TOOL_NAME_RE.match(name):
        c.fail(f"{field}.name", f"expected a tool name matching {TOOL_NAME_RE.pattern}, got {name!r}")
    desc = c.text(raw.get("description", ""), f"{field}.description", allow_empty=True)
    schema = c.mapping(raw.get("inputSchema"), f"{field}.inputSchema")
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.exceptions.SchemaError as err:
        where = _path_str(f"{field}.inputSchema", list(err.absolute_path))
        if err.absolute_path and err.absolute_path[-1] == "type":
            c.fail(
                where,
                f"invalid JSON Schema: type {err.instance!r} is not a JSON Schema type; expected one of "
                f"{', '.join(JSON_SCHEMA_TYPES)} (or a list of them)",
            )
        c.fail(where, f"invalid JSON Schema: {err.message}")
    if schema.get("type") != "object":
        c.fail(f"{field}.inputSchema.type", f"expected 'object', got {schema.get('type')!r}")
    problem = schema_problem(schema)
    if problem:
        c.fail(_path_str(f"{field}.inputSchema", problem[0]), problem[1])
    impl, arg_paths = _load_binding(raw.get(BINDING_KEY), f"{field}.{BINDING_KEY}", schema, c, bindings)
    return Tool(name=name, description=desc, input_schema=schema, impl=impl, arg_paths=arg_paths)


def _load_binding(bind: Any, field: str, schema: Mapping, c: _Checker,
                  bindings: WorldBindings) -> tuple[str, dict[str, tuple[str, ...]]]:
    """A tool's world binding `x-hat: {impl, arg_paths}`, checked against the schema and `bindings`: a known impl
    or "distractor:NAME", no argument the impl does not take, every required one mapped."""
    c.mapping(bind, field)
    c.keys(bind, ("impl", "arg_paths"), field)
    impl = c.text(bind.get("impl"), f"{field}.impl")
    args = bindings.args_of(impl)
    if args is None and not impl.startswith(DISTRACTOR_PREFIX):
        known = (*bindings.tool_args, SKILL_TOOL_IMPL)
        c.fail(f"{field}.impl", f"expected one of {', '.join(known)} or '{DISTRACTOR_PREFIX}NAME', got {impl!r}")
    arg_paths = {}
    for arg, path in c.mapping(bind.get("arg_paths", {}) or {}, f"{field}.arg_paths").items():
        where = f"{field}.arg_paths.{arg}"
        path = [path] if isinstance(path, str) else path
        c.seq(path, where)
        if not path or not all(isinstance(p, str) and p for p in path):
            c.fail(where, f"expected a non-empty list of property names, got {path!r}")
        problem = arg_path_problem(schema, path)
        if problem:
            c.fail(where, problem)
        arg_paths[arg] = tuple(path)
    if args is not None:
        required, optional = args
        for arg in arg_paths:
            if arg not in required + optional:
                c.fail(f"{field}.arg_paths.{arg}", f"{impl} takes no argument {arg!r}; it takes "
                                                   f"{', '.join(required + optional)}")
        for arg in required:
            if arg not in arg_paths:
                c.fail(f"{field}.arg_paths", f"missing required argument {arg!r} of {impl}")
    return impl, arg_paths


def _load_sections(raw: Any, c: _Checker) -> list[PromptSection]:
    sections = []
    for i, sec in enumerate(c.seq(raw, "prompt")):
        f = f"prompt[{i}]"
        c.mapping(sec, f)
        c.keys(sec, ("key", "title", "text", "constraints"), f)
        constraints = []
        for j, con in enumerate(c.seq(sec.get("constraints", []) or [], f"{f}.constraints")):
            cf = f"{f}.constraints[{j}]"
            c.mapping(con, cf)
            c.keys(con, ("id", "kwargs"), cf)
            cid = c.text(con.get("id"), f"{cf}.id")
            if cid not in CONSTRAINT_REGISTRY:
                c.fail(f"{cf}.id", f"expected one of {', '.join(CONSTRAINT_REGISTRY)}, got {cid!r}")
            kwargs = c.mapping(con.get("kwargs", {}) or {}, f"{cf}.kwargs")
            c.against(kwargs, CONSTRAINT_REGISTRY[cid].params_schema, f"{cf}.kwargs")
            constraints.append(Constraint(id=cid, kwargs=kwargs))
        sections.append(
            PromptSection(
                key=c.text(sec.get("key"), f"{f}.key"),
                title=c.text(sec.get("title"), f"{f}.title"),
                text=c.text(sec.get("text", ""), f"{f}.text", allow_empty=True),
                constraints=tuple(constraints),
            )
        )
    keys = [s.key for s in sections]
    for i, k in enumerate(keys):
        if k in keys[:i]:
            c.fail(f"prompt[{i}].key", f"duplicate section key {k!r}")
    for i, sec in enumerate(sections):
        _check_placeholders(sec, f"prompt[{i}].text", c)
    return sections


def _check_placeholders(section: PromptSection, field: str, c: _Checker) -> None:
    """Refuses a `{name}` in a section's text that rendering would leave verbatim: any name but {skill_tool}, and
    {skill_tool} outside the "skills" section (the only place it is replaced)."""
    for m in PLACEHOLDER_RE.finditer(section.text):
        name = m.group(1)
        if name == SKILL_TOOL_NAME and section.key == "skills":
            continue
        where = f"section {section.key!r}"
        if name == SKILL_TOOL_NAME:
            c.fail(field, f"{where}: {{{name}}} is replaced only in the 'skills' section's text; write the tool's "
                          "name here")
        hint = difflib.get_close_matches(name, [SKILL_TOOL_NAME], n=1)
        c.fail(field, f"{where}: unknown placeholder {{{name}}}"
                      + (f" (did you mean {{{hint[0]}}}?)" if hint else "")
                      + f"; the only placeholder is {{{SKILL_TOOL_NAME}}}, in the 'skills' section")


def _load_hooks(raw: Any, tool_names: set[str], c: _Checker) -> list[HookSpec]:
    hooks_raw = c.mapping(raw, "hooks")
    for event in hooks_raw:
        if event not in HOOK_EVENTS:
            c.fail(f"hooks.{event}", f"unknown lifecycle event; expected one of {', '.join(HOOK_EVENTS)}")
    hooks = []
    for event in HOOK_EVENTS:
        for i, spec in enumerate(c.seq(hooks_raw.get(event, []) or [], f"hooks.{event}") if event in hooks_raw else []):
            f = f"hooks.{event}[{i}]"
            c.mapping(spec, f)
            c.keys(spec, ("handler", "matcher", "params"), f)
            name = c.text(spec.get("handler"), f"{f}.handler")
            handler = HOOK_REGISTRY.get(name)
            if handler is None:
                c.fail(f"{f}.handler", f"unknown hook handler {name!r}; expected one of {', '.join(HOOK_REGISTRY)}")
            if event not in handler.events:
                c.fail(f"{f}.handler", f"{name} runs on {', '.join(handler.events)}, not {event}")
            matcher = spec.get("matcher")
            if matcher is not None:
                c.text(matcher, f"{f}.matcher")
                if event in ("Stop", "UserPromptSubmit"):
                    c.fail(f"{f}.matcher", f"{event} hooks take no tool matcher")
                if matcher not in tool_names:
                    c.fail(f"{f}.matcher", f"expected the name of a tool of this harness, got {matcher!r}")
            params = c.mapping(spec.get("params", {}) or {}, f"{f}.params")
            c.against(params, handler.params_schema, f"{f}.params")
            hooks.append(HookSpec(event=event, handler=name, matcher=matcher, params=params))
    return hooks


def _load_skills(raw: Any, folder: Path, file: Path, tool_names: set[str], c: _Checker,
                 bindings: WorldBindings) -> tuple[list[str], list[Skill]]:
    """The manifest's `skills` list and each skill's SKILL.md (allowed tools defined, at most one skill per world
    skill, `metadata.hat-skill-key`). A world skill that no skill binds is logged as a warning, not an error: a
    partial harness is legal; the tasks of that skill then have no skill to load."""
    skill_names = [c.text(s, f"skills[{i}]") for i, s in enumerate(c.seq(raw.get("skills", []) or [], "skills"))]
    for i, n in enumerate(skill_names):
        if n in skill_names[:i]:
            c.fail(f"skills[{i}]", f"duplicate skill name {n!r}")
    skills = []
    for i, n in enumerate(skill_names):
        skill, skill_file = _load_skill(folder, n, f"skills[{i}]", bindings.skill_keys)
        for tool in skill.allowed_tools:
            if tool not in tool_names:
                raise HarnessError(
                    skill_file, "allowed-tools", f"names tool {tool!r}, which the harness does not define"
                )
        bound = next((s for s in skills if skill.key and s.key == skill.key), None)
        if bound is not None:
            raise HarnessError(
                skill_file,
                f"metadata.{SKILL_KEY_FIELD}",
                f"world skill {skill.key!r} is already bound by skill {bound.name!r}; expected at most one skill per key",
            )
        skills.append(skill)
    unbound = [k for k in bindings.skill_keys if not any(s.key == k for s in skills)]
    if unbound:
        log.warning("%s: no skill is bound to world skill(s) %s (metadata.%s)", file, ", ".join(unbound), SKILL_KEY_FIELD)
    return skill_names, skills


def _check_skill_tool(skill_tool: str, tools: list[Tool], skill_names: list[str], c: _Checker) -> None:
    """The skill tool exists, is bound to the skill loader, and its enum (if any) lists exactly the skills."""
    loader_tool = next((t for t in tools if t.name == skill_tool), None)
    if loader_tool is None:
        c.fail("skill_tool", f"expected the name of a tool of this harness, got {skill_tool!r}")
    if loader_tool.impl != SKILL_TOOL_IMPL:
        c.fail(
            "skill_tool",
            f"tool {skill_tool!r} must have {BINDING_KEY}.impl {SKILL_TOOL_IMPL!r}, has {loader_tool.impl!r}",
        )
    idx = [t.name for t in tools].index(skill_tool)
    arg_schema = loader_tool.input_schema
    for key in loader_tool.arg_paths["skill"]:
        arg_schema = arg_schema["properties"][key]
    enum = arg_schema.get("enum")
    if enum is not None and sorted(enum) != sorted(skill_names):
        c.fail(
            _path_str(
                f"tools[{idx}].inputSchema",
                [p for k in loader_tool.arg_paths["skill"] for p in ("properties", k)] + ["enum"],
            ),
            f"expected exactly the skill names {skill_names}, got {enum}",
        )


def _check_tool_order(sections: list[PromptSection], tools: list[Tool], c: _Checker) -> None:
    """Every "tool_order" constraint names impls that some tool is bound to."""
    for i, sec in enumerate(sections):
        for j, con in enumerate(sec.constraints):
            if con.id == "tool_order":
                for role in ("first", "then"):
                    if not any(t.impl == con.kwargs[role] for t in tools):
                        c.fail(
                            f"prompt[{i}].constraints[{j}].kwargs.{role}",
                            f"no tool is bound to impl {con.kwargs[role]!r}",
                        )


def load_harness(path: str | Path, bindings: WorldBindings) -> HarnessState:
    """Reads and validates a harness folder against what its world offers.

    Args:
      path: the harness folder, or its `harness.yaml`.
      bindings: the world functions and world skills the harness may bind to (this project's world:
        `hat_jax.sim.world_harness.WORLD_BINDINGS`, or `load_world_harness`).
    Returns:
      the `HarnessState` (skills and tools in file order, hooks in `HOOK_EVENTS` order).
    Raises:
      HarnessError: any malformed or inconsistent field, naming file, field path and what was
        expected (missing or non-UTF-8 file, invalid YAML, duplicate key/tool/skill/section, invalid
        JSON Schema, a `$ref` that resolves nowhere, a `required` name that is not a property, an impl
        or skill key `bindings` does not offer, arguments its impl does not take or a required one
        missing, unknown hook event/handler/constraint, bad hook or constraint parameters, arg_paths
        not pointing into the schema, skill `allowed-tools` naming a missing tool, a SKILL.md whose
        name differs from its folder, two skills bound to one world skill, a bad skill tool, ...).
      A world skill no skill binds is only logged (warning).
    """
    path = Path(path)
    folder = path.parent if path.name == MANIFEST or path.is_file() else path
    file = path if path.is_file() else folder / MANIFEST
    if not file.is_file():
        raise HarnessError(file, "", "harness manifest not found")
    raw = _read_yaml(_read_text(file), file)
    c = _Checker(file)
    c.mapping(raw, "(top level)")
    c.keys(raw, _MANIFEST_KEYS, "")
    tools = [_load_tool(t, f"tools[{i}]", c, bindings) for i, t in enumerate(c.seq(raw.get("tools"), "tools"))]
    names = [t.name for t in tools]
    for i, n in enumerate(names):
        if n in names[:i]:
            c.fail(f"tools[{i}].name", f"duplicate tool name {n!r} (also tools[{names.index(n)}])")
    skill_names, skills = _load_skills(raw, folder, file, set(names), c, bindings)
    skill_tool = c.text(raw.get("skill_tool"), "skill_tool")
    _check_skill_tool(skill_tool, tools, skill_names, c)
    sections = _load_sections(raw.get("prompt"), c)
    if skills and not any(s.key == "skills" for s in sections):
        c.fail("prompt", "expected a section with key 'skills' (where the skills are listed)")
    _check_tool_order(sections, tools, c)
    style = raw.get("heading_style", "markdown")
    if style not in HEADING_STYLES:
        c.fail("heading_style", f"expected one of {', '.join(HEADING_STYLES)}, got {style!r}")
    listing = raw.get("skill_listing", "name_first")
    if listing not in SKILL_LISTINGS:
        c.fail("skill_listing", f"expected one of {', '.join(SKILL_LISTINGS)}, got {listing!r}")
    return HarnessState(
        name=c.text(raw.get("name"), "name"),
        version=str(c.typed(raw.get("version"), (str, int, float), "version", "a version string")),
        skill_tool=skill_tool,
        skills=tuple(skills),
        tools=tuple(tools),
        sections=tuple(sections),
        heading_style=style,
        hooks=tuple(_load_hooks(raw.get("hooks", {}) or {}, set(names), c)),
        family=c.text(raw.get("family", "original"), "family"),
        skill_listing=listing,
    )
