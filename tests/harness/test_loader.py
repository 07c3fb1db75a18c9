"""Harness folders: the shipped production harness, the dump/load round trip, and every bad-input error."""

from pathlib import Path

import pytest
import yaml

from hat_jax.harness.loader import HarnessError
from hat_jax.harness.state import HookSpec, Skill, Tool
from hat_jax.harness.writer import dump_harness, harness_manifest
from hat_jax.sim.tools import TOOL_IMPLS
from hat_jax.sim.types import SKILL_KEYS
from hat_jax.harness.render import render_system_prompt
from hat_jax.sim.world_harness import (
    PRODUCTION_DIR,
    harness_content_digest,
    load_world_harness,
    production_harness,
    shipped_harnesses,
    world_harness,
)


def test_production_harness_contents():
    h = production_harness()
    assert h.name == "production" and h.family == "original" and h.heading_style == "markdown"
    assert len(h.tools) >= 9 and len(h.skills) == 7
    assert {t.impl for t in h.tools} == set(TOOL_IMPLS) | {"load_skill"}
    assert [s.key for s in h.skills] == list(SKILL_KEYS)
    loader = h.tool(h.skill_tool)
    assert loader.impl == "load_skill" and loader.arg_paths == {"skill": ("skill",)}
    assert loader.input_schema["properties"]["skill"]["enum"] == [s.name for s in h.skills]
    assert h.tool_by_impl("get_stock").arg_paths == {"sku_id": ("sku_id",)}
    assert h.skill("product-qa").allowed_tools == ("search_products", "get_product_detail", "get_stock")
    assert h.skill("product-qa").body.startswith("# 商品问答\n\n1. ")
    assert [s.key for s in h.sections] == ["persona", "skills", "rules", "style", "safety"]
    assert "每个事实都必须来自工具结果" in next(s.text for s in h.sections if s.key == "rules")
    assert h.hooks == (
        HookSpec("PostToolUseFailure", "retry_on_tool_error", None, {"max_attempts": 2}),
        HookSpec("Stop", "reply_length_limit", None, {"max_chars": 150}),
        HookSpec("Stop", "compliance_check", None, {"checks": ["human_claim", "refund_promise", "absolute_claim"]}),
    )
    assert [(c.id, dict(c.kwargs)) for c in h.constraints()] == [
        ("tool_order", {"first": "get_product_detail", "then": "get_stock"}),
        ("max_chars", {"n": 120}),
        ("address_term", {"term": "宝宝"}),
        ("no_bullets", {}),
    ]
    assert production_harness() is h  # cached
    assert load_world_harness(PRODUCTION_DIR / "harness.yaml") == h  # the manifest path works too


def test_round_trip_production_and_a_variant(tmp_path):
    h = production_harness()
    assert load_world_harness(dump_harness(h, tmp_path / "a")) == h
    # A variant with renamed, nested arguments, a distractor tool and skill, xml headings and a matcher.
    stock = h.tool_by_impl("get_stock")
    nested = Tool(
        "kucun_chaxun",
        "查库存",
        {
            "type": "object",
            "properties": {
                "q": {"type": "object", "properties": {"sku": {"type": "string"}}},
                "note": {"type": "string"},
            },
        },
        "get_stock",
        {"sku_id": ("q", "sku")},
    )
    distractor = Tool("get_weather", "天气", {"type": "object", "properties": {}}, "distractor:get_weather", {})
    tools = tuple(nested if t is stock else t for t in h.tools) + (distractor,)
    extra = Skill("weather-chat", "聊天气。", "# 天气\n\n随便聊聊。", ("get_weather",), "")
    loader = h.tool(h.skill_tool)
    schema = {
        **loader.input_schema,
        "properties": {"skill": {"type": "string", "enum": [s.name for s in h.skills] + [extra.name]}},
    }
    tools = tuple(Tool(t.name, t.description, schema, t.impl, t.arg_paths) if t is loader else t for t in tools)
    skills = tuple(
        Skill(
            s.name,
            s.description,
            s.body,
            tuple("kucun_chaxun" if n == "get_stock" else n for n in s.allowed_tools),
            s.key,
        )
        for s in h.skills
    ) + (extra,)
    hooks = h.hooks + (HookSpec("PreToolUse", "tool_call_limit", "kucun_chaxun", {"max_calls": 3}),)
    v = h.replace(
        version="2026.11.0+hsa.7",
        tools=tools,
        skills=skills,
        heading_style="xml",
        skill_listing="description_first",
        family="v1",
        hooks=tuple(
            sorted(
                hooks,
                key=lambda k: ("UserPromptSubmit", "PreToolUse", "PostToolUse", "PostToolUseFailure", "Stop").index(
                    k.event
                ),
            )
        ),
    )
    back = load_world_harness(dump_harness(v, tmp_path / "b"))
    assert back == v
    assert back.tool("kucun_chaxun").arg_paths == {"sku_id": ("q", "sku")}
    assert back.skill("weather-chat").key == "" and back.hooks[0].matcher == "kucun_chaxun"


def _write(
    tmp_path: Path, mutate=None, *, skill: str | None = None, skill_text: str | None = None, raw: str | None = None
) -> Path:
    folder = tmp_path / "h"
    dump_harness(production_harness(), folder)
    manifest = harness_manifest(production_harness())
    if mutate is not None:
        mutate(manifest)
    text = raw if raw is not None else yaml.safe_dump(manifest, allow_unicode=True, sort_keys=False)
    (folder / "harness.yaml").write_text(text, encoding="utf-8")
    if skill is not None:
        (folder / "skills" / skill).mkdir(parents=True, exist_ok=True)
        (folder / "skills" / skill / "SKILL.md").write_text(skill_text, encoding="utf-8")
    return folder


def _tool(m, name):
    return next(t for t in m["tools"] if t["name"] == name)


def _set(path, value):
    def mutate(m):
        node = m
        for p in path[:-1]:
            node = node[p]
        node[path[-1]] = value

    return mutate


BAD_MANIFESTS = [
    (
        "duplicate tool",
        lambda m: m["tools"][1].update(name=m["tools"][0]["name"]),
        "tools[1].name",
        "duplicate tool name",
    ),
    (
        "schema type",
        _set(["tools", 3, "inputSchema", "properties", "sku_id", "type"], "strin"),
        "tools[3].inputSchema.properties.sku_id.type",
        "invalid JSON Schema: type 'strin' is not a JSON Schema type; "
        "expected one of array, boolean, integer, null, number, object, string",
    ),
    (
        "ref to nowhere",
        _set(["tools", 3, "inputSchema", "properties", "sku_id"], {"$ref": "#/$defs/sku"}),
        "tools[3].inputSchema.properties.sku_id.$ref",
        "reference '#/$defs/sku' points nowhere in the inputSchema",
    ),
    (
        "remote ref",
        _set(["tools", 3, "inputSchema", "properties", "sku_id"], {"$ref": "https://example.com/sku.json"}),
        "tools[3].inputSchema.properties.sku_id.$ref",
        "expected a local reference",
    ),
    (
        "required not a property",
        _set(["tools", 3, "inputSchema", "required"], ["sku_id", "sku"]),
        "tools[3].inputSchema.required[1]",
        "names 'sku', which is not in the schema's properties (sku_id)",
    ),
    (
        "schema not object",
        _set(["tools", 2, "inputSchema", "type"], "array"),
        "tools[2].inputSchema.type",
        "expected 'object'",
    ),
    ("unknown event", lambda m: m["hooks"].update(OnReply=[]), "hooks.OnReply", "unknown lifecycle event"),
    (
        "unknown handler",
        _set(["hooks", "Stop", 0, "handler"], "run_shell"),
        "hooks.Stop[0].handler",
        "unknown hook handler 'run_shell'",
    ),
    (
        "wrong event",
        lambda m: m["hooks"]["Stop"].append({"handler": "retry_on_tool_error", "params": {"max_attempts": 2}}),
        "hooks.Stop[2].handler",
        "runs on PostToolUseFailure",
    ),
    (
        "bad param type",
        _set(["hooks", "PostToolUseFailure", 0, "params", "max_attempts"], "two"),
        "hooks.PostToolUseFailure[0].params.max_attempts",
        "is not of type 'integer'",
    ),
    (
        "extra param",
        _set(["hooks", "Stop", 0, "params", "min_chars"], 3),
        "hooks.Stop[0].params",
        "Additional properties",
    ),
    (
        "bad check",
        _set(["hooks", "Stop", 1, "params", "checks"], ["human_claim", "be_nice"]),
        "hooks.Stop[1].params.checks[1]",
        "is not one of",
    ),
    (
        "matcher on Stop",
        _set(["hooks", "Stop", 0, "matcher"], "get_price"),
        "hooks.Stop[0].matcher",
        "take no tool matcher",
    ),
    (
        "matcher unknown",
        lambda m: m["hooks"]["PostToolUseFailure"][0].update(matcher="nope"),
        "hooks.PostToolUseFailure[0].matcher",
        "name of a tool",
    ),
    ("skill tool missing", _set(["skill_tool"], "pick_skill"), "skill_tool", "expected the name of a tool"),
    ("skill tool impl", _set(["skill_tool"], "get_price"), "skill_tool", "must have x-hat.impl 'load_skill'"),
    (
        "unknown impl",
        _set(["tools", 0, "x-hat", "impl"], "delete_everything"),
        "tools[0].x-hat.impl",
        "expected one of search_products",
    ),
    (
        "arg path off schema",
        _set(["tools", 2, "x-hat", "arg_paths", "product_id"], ["pid"]),
        "tools[2].x-hat.arg_paths.product_id",
        "'pid' is not a property",
    ),
    (
        "missing canonical arg",
        lambda m: _tool(m, "estimate_shipping")["x-hat"]["arg_paths"].pop("region"),
        "tools[5].x-hat.arg_paths",
        "missing required argument 'region' of estimate_shipping",
    ),
    (
        "unknown canonical arg",
        _set(["tools", 2, "x-hat", "arg_paths", "colour"], ["product_id"]),
        "tools[2].x-hat.arg_paths.colour",
        "get_price takes no argument 'colour'",
    ),
    (
        "enum mismatch",
        lambda m: _tool(m, "load_skill")["inputSchema"]["properties"]["skill"]["enum"].pop(),
        "tools[8].inputSchema.properties.skill.enum",
        "expected exactly the skill names",
    ),
    ("duplicate skill", lambda m: m["skills"].append("logistics"), "skills[7]", "duplicate skill name"),
    ("skill folder missing", lambda m: m["skills"].append("ghost"), "skills[7]", "has no skills/ghost/SKILL.md"),
    (
        "unknown constraint",
        _set(["prompt", 3, "constraints", 0, "id"], "be_short"),
        "prompt[3].constraints[0].id",
        "expected one of max_chars",
    ),
    (
        "bad constraint kwargs",
        _set(["prompt", 3, "constraints", 0, "kwargs", "n"], 0),
        "prompt[3].constraints[0].kwargs.n",
        "less than the minimum",
    ),
    (
        "tool_order impl unbound",
        _set(["prompt", 2, "constraints", 0, "kwargs", "first"], "get_weather"),
        "prompt[2].constraints[0].kwargs.first",
        "no tool is bound to impl 'get_weather'",
    ),
    (
        "duplicate section",
        lambda m: m["prompt"].append(dict(m["prompt"][0])),
        "prompt[5].key",
        "duplicate section key 'persona'",
    ),
    ("no skills section", lambda m: m["prompt"].pop(1), "prompt", "section with key 'skills'"),
    ("heading style", _set(["heading_style"], "html"), "heading_style", "expected one of markdown"),
    ("skill listing", _set(["skill_listing"], "by_name"), "skill_listing",
     "expected one of name_first, description_first, got 'by_name'"),
    ("unknown top key", _set(["prompts"], []), "prompts", "unknown key"),
    ("tool extra key", _set(["tools", 0, "run"], "rm -rf /"), "tools[0].run", "unknown key"),
    ("tool name", _set(["tools", 0, "name"], "search products"), "tools[0].name", "expected a tool name"),
    ("placeholder typo", _set(["prompt", 1, "text"], "先调用 {skil_tool} 加载技能。"), "prompt[1].text",
     "section 'skills': unknown placeholder {skil_tool} (did you mean {skill_tool}?); the only placeholder is "
     "{skill_tool}, in the 'skills' section"),
    ("unknown placeholder", _set(["prompt", 0, "text"], "你是{host_name}。"), "prompt[0].text",
     "section 'persona': unknown placeholder {host_name}; the only placeholder is {skill_tool}"),
    ("placeholder elsewhere", _set(["prompt", 0, "text"], "先调用 {skill_tool}。"), "prompt[0].text",
     "section 'persona': {skill_tool} is replaced only in the 'skills' section's text"),
]


@pytest.mark.parametrize("case, mutate, field, expected", BAD_MANIFESTS, ids=[c[0] for c in BAD_MANIFESTS])
def test_bad_manifest_errors_name_file_field_and_expectation(tmp_path, case, mutate, field, expected):
    folder = _write(tmp_path, mutate)
    with pytest.raises(HarnessError) as info:
        load_world_harness(folder)
    err = info.value
    assert err.file == str(folder / "harness.yaml") and err.field == field, str(err)
    assert expected in err.expected, str(err)
    assert str(err).startswith(f"{folder / 'harness.yaml'}: {field}: ")


GOOD_FRONT = "---\nname: size-advice\ndescription: 尺码。\n---\n# 尺码\n"
BAD_SKILLS = [
    (
        "missing tool",
        GOOD_FRONT.replace("description: 尺码。", "description: 尺码。\nallowed-tools: get_size_chart measure_viewer"),
        "allowed-tools",
        "names tool 'measure_viewer'",
    ),
    (
        "name differs",
        GOOD_FRONT.replace("name: size-advice", "name: size-help"),
        "name",
        "expected 'size-advice' (the folder name)",
    ),
    ("name style", GOOD_FRONT.replace("name: size-advice", "name: Size_Advice"), "name", "lowercase letters"),
    ("no front matter", "# 尺码\n", "front matter", "start with a '---' line"),
    ("unclosed", "---\nname: size-advice\n", "front matter", "closing '---'"),
    ("not a mapping", "---\n- a\n---\nbody\n", "front matter", "expected a YAML mapping"),
    ("unknown key", GOOD_FRONT.replace("---\n#", "command: rm\n---\n#"), "command", "unknown key"),
    ("no description", "---\nname: size-advice\n---\nbody\n", "description", "expected a string"),
    (
        "bad key",
        GOOD_FRONT.replace("description: 尺码。", "description: 尺码。\nmetadata: {hat-skill-key: sizing}"),
        "metadata.hat-skill-key",
        "expected one of product_qa",
    ),
    ("empty body", "---\nname: size-advice\ndescription: 尺码。\n---\n\n", "body", "non-empty Markdown body"),
    ("huge body", GOOD_FRONT + "尺" * 5_000_000, "body",
     "expected at most 16000 characters (the body is sent whole through the skill tool), got 5000005"),
]


@pytest.mark.parametrize("case, text, field, expected", BAD_SKILLS, ids=[c[0] for c in BAD_SKILLS])
def test_bad_skill_errors_name_the_skill_file(tmp_path, case, text, field, expected):
    folder = _write(tmp_path, skill="size-advice", skill_text=text)
    with pytest.raises(HarnessError) as info:
        load_world_harness(folder)
    assert info.value.file == str(folder / "skills" / "size-advice" / "SKILL.md"), str(info.value)
    assert info.value.field == field and expected in info.value.expected, str(info.value)


def test_yaml_is_never_executed_and_duplicate_keys_are_errors(tmp_path):
    folder = _write(tmp_path, raw="name: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(HarnessError, match="invalid YAML"):
        load_world_harness(folder)
    text = (
        (PRODUCTION_DIR / "harness.yaml")
        .read_text(encoding="utf-8")
        .replace("family: original", "family: original\nname: other")
    )
    folder = _write(tmp_path, raw=text)
    with pytest.raises(HarnessError, match="duplicate key 'name'"):
        load_world_harness(folder)


def test_missing_manifest(tmp_path):
    with pytest.raises(HarnessError, match="harness manifest not found"):
        load_world_harness(tmp_path)


def test_a_local_ref_that_resolves_loads_and_validates_calls(tmp_path, world):
    from hat_jax.sim.executor import execute_tool_call

    def mutate(m):
        schema = m["tools"][3]["inputSchema"]
        schema["$defs"] = {"sku": {"type": "string"}}
        schema["properties"]["sku_id"] = {"$ref": "#/$defs/sku"}

    h = load_world_harness(_write(tmp_path, mutate))
    assert h.tools[3].input_schema["properties"]["sku_id"] == {"$ref": "#/$defs/sku"}
    ex = execute_tool_call(world, h, h.tools[3].name, {"sku_id": 5})
    assert ex.status == "invalid_arguments" and ex.result["error"]["details"]["errors"][0]["path"] == "sku_id"


def test_required_may_name_an_enclosing_schemas_property(tmp_path):
    def mutate(m):
        schema = m["tools"][5]["inputSchema"]  # estimate_shipping: product_id, region
        schema["anyOf"] = [{"required": ["product_id"]}, {"required": ["region"]}]

    assert load_world_harness(_write(tmp_path, mutate)).tools[5].input_schema["anyOf"][1] == {"required": ["region"]}
    bad = _write(tmp_path / "b", _set(["tools", 5, "inputSchema", "anyOf"], [{"required": ["city"]}]))
    with pytest.raises(HarnessError) as info:
        load_world_harness(bad)
    assert info.value.field == "tools[5].inputSchema.anyOf[0].required[0]" and "'city'" in info.value.expected


def test_non_utf8_files_are_harness_errors_naming_the_file(tmp_path):
    folder = _write(tmp_path)
    manifest = folder / "harness.yaml"
    manifest.write_bytes(b"name: \xff\xfe\n")
    with pytest.raises(HarnessError) as info:
        load_world_harness(folder)
    assert info.value.file == str(manifest) and "expected UTF-8 text; byte 0xff at offset 6" in info.value.expected
    folder = _write(tmp_path / "b")
    skill = folder / "skills" / "logistics" / "SKILL.md"
    skill.write_bytes(skill.read_bytes().replace("物流".encode(), "物流".encode("gbk"), 1))
    with pytest.raises(HarnessError) as info:
        load_world_harness(folder)
    assert info.value.file == str(skill) and "expected UTF-8 text" in info.value.expected


def test_one_skill_per_world_skill_and_a_warning_for_unbound_keys(tmp_path, caplog):
    text = (PRODUCTION_DIR / "skills" / "size-advice" / "SKILL.md").read_text(encoding="utf-8")
    folder = _write(tmp_path, skill="size-advice", skill_text=text.replace("size_advice", "logistics"))
    with pytest.raises(HarnessError) as info:  # size-advice now claims logistics; logistics comes next
        load_world_harness(folder)
    assert info.value.file == str(folder / "skills" / "logistics" / "SKILL.md")
    assert info.value.field == "metadata.hat-skill-key"
    assert "world skill 'logistics' is already bound by skill 'size-advice'" in info.value.expected
    # A harness without a size skill is legal (partial), and the loader says so.
    folder = _write(tmp_path / "b", skill="size-advice", skill_text=text.replace("hat-skill-key: size_advice", ""))
    with caplog.at_level("WARNING", logger="hat_jax.harness.loader"):
        h = load_world_harness(folder)
    assert h.skill("size-advice").key == ""
    assert "no skill is bound to world skill(s) size_advice" in caplog.text


def test_the_loader_checks_bindings_against_the_world_it_is_given():
    from hat_jax.harness.loader import WorldBindings, load_harness
    from hat_jax.sim.world_harness import WORLD_BINDINGS

    h = production_harness()
    idx = [t.impl for t in h.tools].index("get_price")
    assert load_harness(PRODUCTION_DIR, WORLD_BINDINGS) == h
    stricter = WorldBindings({**WORLD_BINDINGS.tool_args, "get_price": (("product_id", "currency"), ())},
                             WORLD_BINDINGS.skill_keys)
    with pytest.raises(HarnessError) as info:
        load_harness(PRODUCTION_DIR, stricter)
    assert (info.value.field, info.value.expected) == (f"tools[{idx}].x-hat.arg_paths",
                                                       "missing required argument 'currency' of get_price")
    no_price = WorldBindings({k: v for k, v in WORLD_BINDINGS.tool_args.items() if k != "get_price"},
                             WORLD_BINDINGS.skill_keys)
    with pytest.raises(HarnessError) as info:
        load_harness(PRODUCTION_DIR, no_price)
    assert info.value.field == f"tools[{idx}].x-hat.impl"
    assert info.value.expected.endswith("get_after_sales_policy, load_skill or 'distractor:NAME', got 'get_price'")
    one_skill = WorldBindings(WORLD_BINDINGS.tool_args, ("product_qa",))
    with pytest.raises(HarnessError) as info:
        load_harness(PRODUCTION_DIR, one_skill)
    second = h.skills[1]
    assert info.value.file == str(PRODUCTION_DIR / "skills" / second.name / "SKILL.md")
    assert (info.value.field, info.value.expected) == ("metadata.hat-skill-key",
                                                       f"expected one of product_qa, got {second.key!r}")


def test_compact_harness_keeps_the_production_structure():
    """The tiny world's harness: the same skills (world skills, allowed tools), tools (impls and schemas), sections,
    constraints and hooks as production, shorter text, and the skill list with descriptions first."""
    prod, compact = production_harness(), world_harness("compact")
    assert compact.name == "compact" and compact.family == "original" and compact.skill_listing == "description_first"
    assert prod.skill_listing == "name_first"
    assert [(s.name, s.key, s.allowed_tools) for s in compact.skills] == [
        (s.name, s.key, s.allowed_tools) for s in prod.skills]
    assert [(t.name, t.impl, dict(t.input_schema), dict(t.arg_paths)) for t in compact.tools] == [
        (t.name, t.impl, dict(t.input_schema), dict(t.arg_paths)) for t in prod.tools]
    assert [s.key for s in compact.sections] == [s.key for s in prod.sections]
    assert compact.constraints() == prod.constraints() and compact.hooks == prod.hooks
    assert compact.skill_tool == prod.skill_tool
    assert len(render_system_prompt(compact)) < len(render_system_prompt(prod))
    assert "- 价格、优惠和比价 -> price-promotion" in render_system_prompt(compact)
    # every step of a skill body names what it is for before the tool that does it
    assert "查价格：用 `get_price`。" in compact.skill("price-promotion").body


def test_world_harness_by_name_or_folder(tmp_path):
    assert world_harness("production") is production_harness()
    assert shipped_harnesses() == ("compact", "production")
    manifest = dump_harness(world_harness("compact"), tmp_path / "mine")
    assert world_harness(str(manifest.parent)) == world_harness(str(manifest)) == world_harness("compact")
    assert harness_content_digest(str(manifest.parent)) != harness_content_digest("production")
    with pytest.raises(ValueError, match=r"harness 'nope': expected a shipped harness \(compact, production\) or the "
                                         r"path of a harness folder"):
        world_harness("nope")
