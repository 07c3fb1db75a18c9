"""The HSA transforms: pure functions `(harness, rng, ...) -> (harness', NameMap)`.

Variant implemented and why: see `hat_jax.harness.hsa` (composition, config, held-out families).
- `rename_skills`: new skill ids (lowercase-hyphen), the skill tool's enum and every mention follow;
- `rewrite_skills`: skill bodies reordered (blocks, unordered bullets), re-bulleted, paraphrased;
- `rename_tools`: new tool and argument names in one naming style; arg_paths, allowed_tools, hook
  matchers, the skill tool and every mention in descriptions, bodies and prompt text follow;
- `restructure_schemas`: property order, canonical args nested under an object property (arg_paths
  follow), reworded descriptions, optional distractor arguments, tool registry order;
- `distractor_tools`, `distractor_skills`: tools no task needs (impl `DISTRACTOR_PREFIX + name`),
  skills with key "";
- `restyle_prompt`: heading style, section order (persona first), titles, paraphrased text;
- `hook_params`: retry max_attempts and reply max_chars (a tighter limit tightens the prompt's
  "max_chars" constraint too); this one changes behaviour (`behaviour_changed`), so the pipeline
  re-rolls such trajectories with the oracle.
Each transform keeps the world bindings (`Tool.impl`, what each `Tool.arg_paths` entry means,
`Skill.key`) and changes only what the model reads; every name it changes is substituted wherever the
harness mentions it (descriptions, skill bodies, prompt sections, hook matchers, the skill tool's
enum), so the result stays self-consistent. Names come from `hsa_vocab`'s word pieces and styles.

Each is registered with `@hsa_transform(heldout=...)` (`hat_jax.harness.hsa_registry`); `compose`
applies them in the order they are defined here. To add one, define it here with the decorator.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Mapping
from typing import Any

from hat_jax.harness import hsa_vocab as V
from hat_jax.harness.hsa_registry import check_count, check_probability, hsa_transform
from hat_jax.harness.hsa_rewrite import NameMap, leaf_paths, substitute_names
from hat_jax.harness.state import DISTRACTOR_PREFIX, SKILL_TOOL_IMPL, HarnessState, PromptSection, Skill, Tool

# ---------------------------------------------------------------- text helpers over a whole harness


def _map_schema_text(schema: Any, fn) -> Any:
    """Applies `fn` to every "description" string of a JSON Schema (recursively)."""
    if isinstance(schema, Mapping):
        return {
            k: (fn(v) if k == "description" and isinstance(v, str) else _map_schema_text(v, fn))
            for k, v in schema.items()
        }
    if isinstance(schema, list):
        return [_map_schema_text(v, fn) for v in schema]
    return schema


def _substitute_everywhere(h: HarnessState, mapping: Mapping[str, str]) -> HarnessState:
    """Substitutes names in every text the model reads (descriptions, bodies, titles, sections)."""
    if not mapping:
        return h
    sub = lambda text: substitute_names(text, mapping)  # noqa: E731
    skills = tuple(dataclasses.replace(s, description=sub(s.description), body=sub(s.body)) for s in h.skills)
    tools = tuple(
        dataclasses.replace(t, description=sub(t.description), input_schema=_map_schema_text(t.input_schema, sub))
        for t in h.tools
    )
    sections = tuple(dataclasses.replace(s, title=sub(s.title), text=sub(s.text)) for s in h.sections)
    return h.replace(skills=skills, tools=tools, sections=sections)


def _map_enum(schema: Any, mapping: Mapping[str, str], extra: tuple[str, ...] = ()) -> Any:
    """Maps enum values of a schema (the skill tool's skill ids) and appends `extra` ids."""
    if isinstance(schema, Mapping):
        out = {k: _map_enum(v, mapping, extra) for k, v in schema.items()}
        if isinstance(schema.get("enum"), list):
            out["enum"] = [mapping.get(v, v) for v in schema["enum"]] + list(extra)
        return out
    if isinstance(schema, list):
        return [_map_enum(v, mapping, extra) for v in schema]
    return schema


def _update_skill_tool(h: HarnessState, mapping: Mapping[str, str], extra: tuple[str, ...] = ()) -> HarnessState:
    tools = tuple(
        dataclasses.replace(t, input_schema=_map_enum(t.input_schema, mapping, extra))
        if t.impl == SKILL_TOOL_IMPL
        else t
        for t in h.tools
    )
    return h.replace(tools=tools)


def _insert_randomly(items: tuple, new: list, rng: random.Random) -> tuple:
    out = list(items)
    for item in new:
        out.insert(rng.randint(0, len(out)), item)
    return tuple(out)


# ---------------------------------------------------------------- the transforms


@hsa_transform(heldout="forced")
def rename_skills(h: HarnessState, rng: random.Random, *, heldout: bool = False) -> tuple[HarnessState, NameMap]:
    """New skill ids (lowercase-hyphen, word pieces per skill key), mentions and the skill tool's enum follow."""
    taken = {s.name for s in h.skills}
    mapping: dict[str, str] = {}
    for s in h.skills:
        new = V.sample_skill_name(s.key if s.key in V.SKILL_NOUNS else "", rng, heldout=heldout, taken=taken)
        taken.add(new)
        mapping[s.name] = new
    h = h.replace(skills=tuple(dataclasses.replace(s, name=mapping[s.name]) for s in h.skills))
    h = _update_skill_tool(_substitute_everywhere(h, mapping), mapping)
    return h, NameMap(skills=mapping)


def _rewrite_body(body: str, rng: random.Random) -> str:
    """Reorders blocks (a heading stays with what follows it) and bullets, restyles lists, paraphrases.

    Numbered lists keep their order in a new numbering style, or become bullets in a shuffled order
    (each item of a skill body is a self-contained instruction); bullet lists are shuffled.
    """
    blocks = [b for b in body.strip().split("\n\n") if b.strip()]
    head = [blocks.pop(0)] if len(blocks) > 1 and blocks[0].startswith("# ") and "\n" not in blocks[0] else []
    grouped: list[str] = []
    for b in blocks:
        if grouped and grouped[-1].lstrip().startswith("#") and "\n" not in grouped[-1].strip():
            grouped[-1] += "\n\n" + b
        else:
            grouped.append(b)
    rng.shuffle(grouped)
    marker = rng.choice(V.BULLET_MARKERS)
    numbering = rng.choice(V.NUMBER_STYLES + ("bullets",))
    out = []
    for block in head + grouped:
        lines = block.split("\n")
        bullets = [i for i, line in enumerate(lines) if line[:2] in V.BULLET_MARKERS]
        numbered = [i for i, line in enumerate(lines) if V.NUMBERED.match(line)]
        items = [lines[i][2:] for i in bullets]
        if numbering == "bullets":
            items += [V.NUMBERED.sub("", lines[i]) for i in numbered]
            bullets, numbered = sorted(bullets + numbered), []
        rng.shuffle(items)
        for i, item in zip(bullets, items, strict=True):
            lines[i] = marker + item
        for n, i in enumerate(numbered, 1):
            lines[i] = numbering.format(n) + V.NUMBERED.sub("", lines[i])
        out.append("\n".join(lines))
    intro = rng.choice(V.SKILL_INTROS)
    text = "\n\n".join(out[:1] + ([intro] if intro else []) + out[1:])
    return V.paraphrase(text, rng) + ("\n" if body.endswith("\n") else "")


@hsa_transform(heldout="none")
def rewrite_skills(h: HarnessState, rng: random.Random) -> tuple[HarnessState, NameMap]:
    """Skill bodies reordered/re-bulleted/paraphrased and descriptions paraphrased; names untouched."""
    skills = tuple(
        dataclasses.replace(s, body=_rewrite_body(s.body, rng), description=V.paraphrase(s.description, rng))
        for s in h.skills
    )
    return h.replace(skills=skills), NameMap()


def _all_keys(schema: Mapping[str, Any]) -> list[str]:
    out = []
    for key, sub in (schema.get("properties") or {}).items():
        out.append(key)
        if isinstance(sub, Mapping):
            out.extend(_all_keys(sub))
    return out


def _rename_keys(schema: Any, mapping: Mapping[str, str]) -> Any:
    if not isinstance(schema, Mapping):
        return schema
    out = dict(schema)
    if isinstance(schema.get("properties"), Mapping):
        out["properties"] = {mapping.get(k, k): _rename_keys(v, mapping) for k, v in schema["properties"].items()}
    if isinstance(schema.get("required"), list):
        out["required"] = [mapping.get(k, k) for k in schema["required"]]
    return out


def _tool_impl_key(t: Tool) -> str:
    if t.impl.startswith(DISTRACTOR_PREFIX) or t.impl not in V.TOOL_NOUNS:
        return "distractor"
    return t.impl


@hsa_transform(heldout="forced")
def rename_tools(h: HarnessState, rng: random.Random, *, heldout: bool = False) -> tuple[HarnessState, NameMap]:
    """New tool names (one naming style) and argument names (one style, one name per old key)."""
    style = rng.choice(V.HELDOUT_TOOL_STYLES if heldout else V.TRAIN_TOOL_STYLES)
    arg_style = rng.choice(V.HELDOUT_ARG_STYLES if heldout else V.TRAIN_ARG_STYLES)
    prefix = rng.choice(V.PREFIXES) if style == "dotted" or rng.random() < 0.4 else ""
    taken = {t.name for t in h.tools}
    tool_map: dict[str, str] = {}
    for t in h.tools:
        tool_map[t.name] = V.sample_tool_name(
            _tool_impl_key(t), style, rng, heldout=heldout, taken=taken, prefix=prefix
        )
        taken.add(tool_map[t.name])
    canonical_of: dict[str, str] = {}
    for t in h.tools:
        for arg, path in t.arg_paths.items():
            canonical_of.setdefault(path[-1], "skill" if t.impl == SKILL_TOOL_IMPL else arg)
    keys = list(dict.fromkeys(k for t in h.tools for k in _all_keys(t.input_schema)))
    taken_args = set(keys)
    key_map: dict[str, str] = {}
    for k in keys:
        key_map[k] = V.sample_arg_name(canonical_of.get(k, k), arg_style, rng, taken_args)
        taken_args.add(key_map[k])
    tools, args = [], {}
    for t in h.tools:
        paths = {p: tuple(key_map[c] for c in p) for p in leaf_paths(t.input_schema)}
        args[t.name] = paths
        tools.append(
            dataclasses.replace(
                t,
                name=tool_map[t.name],
                input_schema=_rename_keys(t.input_schema, key_map),
                arg_paths={a: tuple(key_map[c] for c in p) for a, p in t.arg_paths.items()},
            )
        )
    h = h.replace(
        tools=tuple(tools),
        skill_tool=tool_map[h.skill_tool],
        skills=tuple(
            dataclasses.replace(s, allowed_tools=tuple(tool_map.get(n, n) for n in s.allowed_tools)) for s in h.skills
        ),
        hooks=tuple(
            dataclasses.replace(k, matcher=tool_map.get(k.matcher, k.matcher) if k.matcher else None) for k in h.hooks
        ),
    )
    name_map = NameMap(tools=tool_map, args=args)
    return _substitute_everywhere(h, name_map.text_map()), name_map


def _key_style(h: HarnessState) -> str:
    styles = Counter(
        V.name_style(k) for t in h.tools for k in _all_keys(t.input_schema) if V.name_style(k) != "snake" or "_" in k
    )
    return styles.most_common(1)[0][0] if styles else "snake"


def _tool_style(h: HarnessState) -> str:
    styles = Counter(V.name_style(t.name) for t in h.tools if not t.impl.startswith(DISTRACTOR_PREFIX))
    return styles.most_common(1)[0][0] if styles else "snake"


def _shuffled_props(schema: Mapping[str, Any], rng: random.Random) -> dict:
    out = dict(schema)
    if isinstance(schema.get("properties"), Mapping):
        items = list(schema["properties"].items())
        rng.shuffle(items)
        out["properties"] = {k: _shuffled_props(v, rng) if isinstance(v, Mapping) else v for k, v in items}
    return out


def _restructure_tool(t: Tool, rng: random.Random, style: str, p_nest: float, p_distr: float) -> tuple[Tool, dict]:
    schema = _shuffled_props(t.input_schema, rng)
    schema = _map_schema_text(schema, lambda d: V.paraphrase(d, rng))
    props = dict(schema.get("properties") or {})
    paths: dict = {}
    arg_paths = dict(t.arg_paths)
    already_nested = any(len(p) > 1 for p in leaf_paths(schema))
    if t.impl != SKILL_TOOL_IMPL and props and not already_nested and rng.random() < p_nest:
        wrapper = rng.choice([w for w in V.WRAPPER_NAMES if w not in props] or ["params_v2"])
        inner = {
            "type": "object",
            "description": rng.choice(("调用参数。", "查询条件。", "请求参数。")),
            "properties": props,
        }
        required = list(schema.get("required") or [])
        if required:
            inner["required"] = required
        if schema.get("additionalProperties") is False:
            inner["additionalProperties"] = False
        schema = {**schema, "properties": {wrapper: inner}, "required": [wrapper] if required else []}
        paths = {p: (wrapper, *p) for p in leaf_paths(t.input_schema)}
        arg_paths = {a: (wrapper, *p) for a, p in t.arg_paths.items()}
    if rng.random() < p_distr:
        props = dict(schema["properties"])
        for name, spec in rng.sample(V.DISTRACTOR_ARGS, rng.randint(1, 2)):
            key = V.style_name(tuple(name.split("_")), style)
            if key not in props:
                props[key] = dict(spec)
        schema = {**schema, "properties": props}
    description = rng.choice(V.TOOL_DESCRIPTION_TEMPLATES).format(d=V.paraphrase(t.description, rng))
    return dataclasses.replace(t, input_schema=schema, arg_paths=arg_paths, description=description), paths


@hsa_transform(heldout="none", check=check_probability("p_nest", "p_distractor_args"))
def restructure_schemas(
    h: HarnessState, rng: random.Random, *, p_nest: float = 0.5, p_distractor_args: float = 0.5
) -> tuple[HarnessState, NameMap]:
    """Property order, nesting under an object property, descriptions, distractor args, tool order."""
    style = _key_style(h)
    tools, args = [], {}
    for t in h.tools:
        new, paths = _restructure_tool(t, rng, style, p_nest, p_distractor_args)
        tools.append(new)
        if paths:
            args[t.name] = paths
    rng.shuffle(tools)
    return h.replace(tools=tuple(tools)), NameMap(args=args)


@hsa_transform(heldout="family", check=check_count("count"))
def distractor_tools(
    h: HarnessState, rng: random.Random, *, heldout: bool = False, count: tuple[int, int] = (1, 3)
) -> tuple[HarnessState, NameMap]:
    """Adds tools no task needs, named in the harness's tool style, at random registry positions."""
    style, arg_style = _tool_style(h), _key_style(h)
    taken = {t.name for t in h.tools}
    new = []
    for _ in range(rng.randint(*count)):
        name = V.sample_tool_name("distractor", style, rng, heldout=heldout, taken=taken)
        taken.add(name)
        topic = next((V.DISTRACTOR_TOPICS[p] for p in V.parse_tool_name(name)[2] if p in V.DISTRACTOR_TOPICS), "运营")
        props: dict[str, Any] = {}
        for canonical in rng.sample(("region", "query", "category"), rng.randint(1, 2)):
            key = V.sample_arg_name(canonical, arg_style, rng, set(props))
            props[key] = {"type": "string", "description": rng.choice(("查询条件。", "可选过滤条件。", "关键词。"))}
        schema = {"type": "object", "properties": props, "required": [next(iter(props))]}
        desc = rng.choice(V.DISTRACTOR_DESCRIPTIONS).format(x=topic)
        new.append(Tool(name=name, description=desc, input_schema=schema, impl=DISTRACTOR_PREFIX + name))
    return h.replace(tools=_insert_randomly(h.tools, new, rng)), NameMap()


@hsa_transform(heldout="family", check=check_count("count"))
def distractor_skills(
    h: HarnessState, rng: random.Random, *, heldout: bool = False, count: tuple[int, int] = (1, 2)
) -> tuple[HarnessState, NameMap]:
    """Adds skills no task needs (key ""), listed in the skill tool's enum."""
    taken = {s.name for s in h.skills}
    distractor_names = [t.name for t in h.tools if t.impl.startswith(DISTRACTOR_PREFIX)]
    new = []
    for _ in range(rng.randint(*count)):
        name = V.sample_skill_name("", rng, heldout=heldout, taken=taken)
        taken.add(name)
        topic = next((V.DISTRACTOR_TOPICS[p] for p in name.split("-") if p in V.DISTRACTOR_TOPICS), "直播运营")
        body = (
            f"# {topic}说明\n\n本技能只用于{topic}相关的运营问题，不涉及商品问答。\n\n"
            f"- 按运营后台的最新安排回答\n- 不要编造{topic}信息\n- 与商品无关的问题保持简短"
        )
        allowed = (rng.choice(distractor_names),) if distractor_names and rng.random() < 0.5 else ()
        new.append(
            Skill(
                name=name, description=f"{topic}相关的运营说明。", body=V.paraphrase(body, rng), allowed_tools=allowed
            )
        )
    h = h.replace(skills=_insert_randomly(h.skills, new, rng))
    return _update_skill_tool(h, {}, tuple(s.name for s in new)), NameMap()


@hsa_transform(heldout="forced")
def restyle_prompt(h: HarnessState, rng: random.Random, *, heldout: bool = False) -> tuple[HarnessState, NameMap]:
    """Heading style, section order, titles and paraphrased text (constraints untouched).

    Train: a `TRAIN_HEADING_STYLES` style, persona (or the first section) stays first, the rest
    shuffled. Held-out: the "bracket" style and the reversed order (persona last).
    """
    sections = list(h.sections)
    if heldout:
        style = rng.choice(V.HELDOUT_HEADING_STYLES)
        sections.reverse()
    else:
        style = rng.choice(V.TRAIN_HEADING_STYLES)
        first = next((s for s in sections if s.key == "persona"), sections[0] if sections else None)
        rest = [s for s in sections if s is not first]
        rng.shuffle(rest)
        sections = ([first] if first else []) + rest
    marker = rng.choice(V.BULLET_MARKERS)

    def restyle(s: PromptSection) -> PromptSection:
        titles = V.SECTION_TITLES.get(s.key)
        lines = [marker + line[2:] if line[:2] in V.BULLET_MARKERS else line for line in s.text.split("\n")]
        return dataclasses.replace(
            s, title=rng.choice(titles) if titles else s.title, text=V.paraphrase("\n".join(lines), rng)
        )

    return h.replace(sections=tuple(restyle(s) for s in sections), heading_style=style), NameMap()


@hsa_transform(heldout="none")
def hook_params(h: HarnessState, rng: random.Random) -> tuple[HarnessState, NameMap]:
    """New retry max_attempts (1..4) and reply max_chars; a tighter limit tightens "max_chars" constraints."""
    hooks = []
    limit = None
    for k in h.hooks:
        params = dict(k.params)
        if k.handler == "retry_on_tool_error":
            cur = int(params.get("max_attempts", 2))
            params["max_attempts"] = rng.choice([n for n in (1, 2, 3, 4) if n != cur])
        elif k.handler == "reply_length_limit" and "max_chars" in params:
            cur = int(params["max_chars"])
            params["max_chars"] = rng.choice([cur + d for d in (-30, -20, -10, 10, 20, 40) if cur + d >= 30])
            limit = params["max_chars"] if limit is None else min(limit, params["max_chars"])
        hooks.append(dataclasses.replace(k, params=params))
    sections = h.sections
    if limit is not None:
        sections = tuple(
            dataclasses.replace(
                s,
                constraints=tuple(
                    dataclasses.replace(c, kwargs={**c.kwargs, "n": min(int(c.kwargs["n"]), limit)})
                    if c.id == "max_chars" and "n" in c.kwargs
                    else c
                    for c in s.constraints
                ),
            )
            for s in h.sections
        )
    return h.replace(hooks=tuple(hooks), sections=sections), NameMap()
