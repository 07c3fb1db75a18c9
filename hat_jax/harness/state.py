"""`HarnessState` h = (S, T, P, K): the skills, tools, system prompt and hooks of one harness version.

The harness is everything outside the weights that can change independently of them (the HAT report,
arXiv 2608.15763 (TaoLive, 2026), "The system"). Its parts follow the agent ecosystem's conventions,
so that a harness written for a real agent fits and ours are readable by people who write harnesses:
- a skill is an open Agent Skills `SKILL.md` (front matter `name`, `description`, `allowed-tools`;
  Markdown body). Name and description are always in the system prompt; the body is the result of
  calling the harness's skill-loading tool (`HarnessState.skill_tool`);
- a tool is an MCP tool definition (`name`, `description`, `inputSchema`);
- the prompt is an ordered list of named sections, rendered with one heading style;
- hooks are keyed by lifecycle event (`UserPromptSubmit`, `PreToolUse`, `PostToolUse`,
  `PostToolUseFailure`, `Stop`), each naming a handler from `hat_jax.harness.hooks.HOOK_REGISTRY`.

What the model sees is only the surface (names, descriptions, schemas, prompt text). Two fields bind
the surface to the simulated world and are never rendered: `Tool.impl` (which world function backs a
tool) with `Tool.arg_paths` (where each canonical argument sits in the surface arguments), and
`Skill.key` (which world skill a skill is). HSA transforms change the surface and keep the bindings,
so the environment, the oracle and the judges work under any harness version without hard-coded
names.

These are plain frozen dataclasses; `hat_jax.harness.loader` reads and validates them from files.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

HOOK_EVENTS: tuple[str, ...] = ("UserPromptSubmit", "PreToolUse", "PostToolUse", "PostToolUseFailure", "Stop")
HEADING_STYLES: tuple[str, ...] = ("markdown", "xml", "plain", "bracket")
HeadingStyle = Literal["markdown", "xml", "plain", "bracket"]
SKILL_LISTINGS: tuple[str, ...] = ("name_first", "description_first")
SkillListing = Literal["name_first", "description_first"]
SKILL_TOOL_IMPL = "load_skill"  # `Tool.impl` of the skill-loading tool
DISTRACTOR_PREFIX = "distractor:"  # `Tool.impl` prefix of tools no task needs


@dataclasses.dataclass(frozen=True)
class Skill:
    """One skill (Agent Skills `SKILL.md`).

    Attributes:
      name: the skill id the model sees and passes to the skill-loading tool (lowercase-hyphen,
        at most 64 characters, equal to its folder name on disk).
      description: one line, always shown in the system prompt.
      body: the Markdown content returned when the skill is loaded.
      allowed_tools: surface names of the tools the skill relies on (each must exist in the harness).
      key: the world skill it is (`hat_jax.sim.types.SKILL_KEYS`), or "" for a distractor skill.
        Never rendered.
    """

    name: str
    description: str
    body: str
    allowed_tools: tuple[str, ...] = ()
    key: str = ""


@dataclasses.dataclass(frozen=True)
class Tool:
    """One tool (MCP tool definition) and its binding to the world.

    Attributes:
      name: the tool name the model calls.
      description: shown to the model.
      input_schema: JSON Schema (draft 2020-12) of the arguments, an object schema.
      impl: the world function that executes it (`hat_jax.sim.tools.TOOL_IMPLS` key,
        `SKILL_TOOL_IMPL` for the skill loader, or `DISTRACTOR_PREFIX + name` for a tool no task
        needs). Never rendered.
      arg_paths: canonical argument name -> path of keys into the surface arguments, e.g.
        {"sku_id": ("query", "sku")} when HSA nested and renamed it. Surface arguments outside these
        paths (distractor optional arguments) are ignored by the world. Never rendered.
    """

    name: str
    description: str
    input_schema: Mapping[str, Any]
    impl: str
    arg_paths: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)

    def openai_spec(self) -> dict:
        """The tool as an OpenAI chat-completions tool (what `apply_chat_template(tools=...)` takes)."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": dict(self.input_schema)},
        }

    def mcp_spec(self) -> dict:
        """The tool as an MCP tool definition (`name`, `description`, `inputSchema`)."""
        return {"name": self.name, "description": self.description, "inputSchema": dict(self.input_schema)}


@dataclasses.dataclass(frozen=True)
class Constraint:
    """A checkable instruction in the prompt (the LLM and TCO metrics check these).

    Attributes:
      id: a `hat_jax.harness.constraints.CONSTRAINT_REGISTRY` key, e.g. "max_chars", "tool_order".
      kwargs: its parameters, e.g. {"n": 80} or {"first": "get_stock", "then": "get_price"}
        (tool-order constraints name tool *impls*; the rendered text uses the current surface names).
    """

    id: str
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class PromptSection:
    """One named section of the system prompt.

    Attributes:
      key: what the section is: "persona", "rules", "style", "safety", "skills", "constraints", ...
        ("skills" is rendered from the harness's skills, its `text` is an intro line).
      title: the heading shown to the model.
      text: the section body (Markdown-free plain text or bullet lines).
      constraints: checkable instructions stated in this section (rendered after `text`).
    """

    key: str
    title: str
    text: str
    constraints: tuple[Constraint, ...] = ()


@dataclasses.dataclass(frozen=True)
class HookSpec:
    """One lifecycle hook: a registered handler bound to an event.

    Attributes:
      event: one of `HOOK_EVENTS`.
      handler: a `hat_jax.harness.hooks.HOOK_REGISTRY` key.
      matcher: for tool events, a tool *surface* name the hook applies to, or None for every tool.
      params: the handler's parameters, validated against its schema in the registry.
    """

    event: str
    handler: str
    matcher: str | None = None
    params: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class HarnessState:
    """h = (S, T, P, K) plus the name of the skill-loading tool and the harness version.

    Attributes:
      name: harness family name, e.g. "production".
      version: version string from the manifest, e.g. "2026.11.0" (HSA appends "+hsa.<seed>").
      skill_tool: surface name of the skill-loading tool (a member of `tools` whose impl is
        `SKILL_TOOL_IMPL`).
      skills, tools: in prompt order.
      sections: the system prompt's sections, in order.
      heading_style: how section titles are written ("markdown": `## T`, "xml": `<t>...</t>`,
        "plain": `T:`, "bracket": `【T】`).
      hooks: in execution order per event.
      family: layout/naming family tag, used to keep held-out families out of training.
      skill_listing: how the "skills" section lists a skill: "name_first" (`- name: description`, the Agent
        Skills convention) or "description_first" (`- description -> name`: what a request matches comes
        first and the name follows it, the order a small model copies fastest; docs/tuning.md).
    """

    name: str
    version: str
    skill_tool: str
    skills: tuple[Skill, ...]
    tools: tuple[Tool, ...]
    sections: tuple[PromptSection, ...]
    heading_style: HeadingStyle = "markdown"
    hooks: tuple[HookSpec, ...] = ()
    family: str = "original"
    skill_listing: SkillListing = "name_first"

    def tool(self, name: str) -> Tool | None:
        """The tool with surface name `name`, or None."""
        return next((t for t in self.tools if t.name == name), None)

    def tool_by_impl(self, impl: str) -> Tool | None:
        """The first tool bound to world function `impl`, or None."""
        return next((t for t in self.tools if t.impl == impl), None)

    def skill(self, name: str) -> Skill | None:
        """The skill with id `name`, or None."""
        return next((s for s in self.skills if s.name == name), None)

    def skill_by_key(self, key: str) -> Skill | None:
        """The first skill bound to world skill `key`, or None."""
        return next((s for s in self.skills if s.key == key), None)

    def hooks_for(self, event: str, tool_name: str | None = None) -> tuple[HookSpec, ...]:
        """The hooks of `event` whose matcher is None or equals `tool_name`."""
        return tuple(h for h in self.hooks if h.event == event and h.matcher in (None, tool_name))

    def constraints(self) -> tuple[Constraint, ...]:
        """Every constraint stated in the prompt, in section order."""
        return tuple(c for s in self.sections for c in s.constraints)

    def openai_tools(self) -> list[dict]:
        """The tools as OpenAI chat-completions tools, in harness order."""
        return [t.openai_spec() for t in self.tools]

    def replace(self, **changes: Any) -> HarnessState:
        """A copy with `changes` applied (dataclasses.replace)."""
        return dataclasses.replace(self, **changes)
