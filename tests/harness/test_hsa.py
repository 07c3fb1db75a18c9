"""HSA transforms, composition, held-out families and trajectory rewriting (hat_jax.harness.hsa)."""

import dataclasses
import json
import random
import re

import jsonschema
import pytest

from hat_jax.harness import hsa
from hat_jax.harness import hsa_transforms as T
from hat_jax.harness import hsa_vocab as V
from hat_jax.harness.hsa_rewrite import leaf_paths, resolve_path, substitute_names
from hat_jax.harness.render import render_system_prompt
from hat_jax.harness.state import DISTRACTOR_PREFIX, SKILL_TOOL_IMPL, Constraint, HookSpec
from hat_jax.harness.writer import dump_harness
from hat_jax.sim.world_harness import load_world_harness, production_harness, world_harness

H = production_harness()
ORIGINAL_NAMES = {t.name for t in H.tools} | {s.name for s in H.skills}


def trajectory() -> list[dict]:
    """A stock+price episode under the production harness (hand-written)."""
    skill = H.skill("price-promotion")
    return [
        {"role": "system", "content": render_system_prompt(H)},
        {"role": "user", "content": "这件卫衣M码黑色还有吗？多少钱？"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "问库存和价格，加载 price-promotion。",
            "tool_calls": [
                {"type": "function", "function": {"name": "load_skill", "arguments": {"skill": "price-promotion"}}}
            ],
        },
        {
            "role": "tool",
            "name": "load_skill",
            "content": json.dumps({"skill": skill.name, "content": skill.body}, ensure_ascii=False),
        },
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "先 get_stock 查 sku_id，再 get_price。",
            "tool_calls": [
                {"type": "function", "function": {"name": "get_stock", "arguments": {"sku_id": "P0001-黑-M"}}},
                {"type": "function", "function": {"name": "get_price", "arguments": {"product_id": "P0001"}}},
            ],
        },
        {
            "role": "tool",
            "name": "get_stock",
            "content": json.dumps({"sku_id": "P0001-黑-M", "stock": 12}, ensure_ascii=False),
        },
        {
            "role": "tool",
            "name": "get_price",
            "content": json.dumps({"error": "工具 get_price 超时", "hook": "重试"}, ensure_ascii=False),
        },
        {"role": "assistant", "content": "宝宝，黑色M码还有12件。", "reasoning_content": "库存12。"},
    ]


def canonical_calls(messages, h):
    """[(impl, canonical args)] of every tool call, read back through `h`'s arg_paths."""
    out = []
    for m in messages:
        for c in m.get("tool_calls") or []:
            tool = h.tool(c["function"]["name"])
            args = c["function"]["arguments"]
            jsonschema.validate(args, dict(tool.input_schema))
            canon = {}
            for name, path in tool.arg_paths.items():
                node = args
                for key in path:
                    node = node.get(key) if isinstance(node, dict) else None
                if node is not None:
                    canon[name] = node
            if tool.impl == SKILL_TOOL_IMPL:
                canon = {"skill": h.skill(canon["skill"]).key}
            out.append((tool.impl, canon))
    return out


def world_bindings(h):
    """(impl, canonical arg names) of every non-distractor tool, sorted."""
    return sorted((t.impl, tuple(sorted(t.arg_paths))) for t in h.tools if not t.impl.startswith(DISTRACTOR_PREFIX))


def test_substitute_names_whole_tokens_only():
    m = {"get_price": "chaxunJiage", "product-qa": "item-facts"}
    assert (
        substitute_names("先调用`get_price`再get_price_v2，用product-qa。", m)
        == "先调用`chaxunJiage`再get_price_v2，用item-facts。"
    )
    assert substitute_names("my_get_price get_price.x get_price.", m) == "my_get_price get_price.x chaxunJiage."


def test_namemap_then_chains_tools_args_and_skills():
    a = hsa.NameMap(tools={"t": "u"}, args={"t": {("x",): ("y",)}}, skills={"s": "r"})
    b = hsa.NameMap(tools={"u": "v", "w": "z"}, args={"u": {("y",): ("p", "y")}, "w": {("k",): ("q", "k")}})
    c = a.then(b)
    assert c.tools == {"t": "v", "w": "z"}
    assert c.args == {"t": {("x",): ("p", "y")}, "w": {("k",): ("q", "k")}}
    assert c.skills == {"s": "r"}


def test_rewrite_messages_hand_checked():
    """rename get_price -> chaxunJiage, nest product_id under params as itemId, rename one skill."""
    price = H.tool("get_price")
    new_price = dataclasses.replace(
        price,
        name="chaxunJiage",
        arg_paths={"product_id": ("params", "itemId")},
        input_schema={
            "type": "object",
            "properties": {
                "params": {"type": "object", "properties": {"itemId": {"type": "string"}}, "required": ["itemId"]}
            },
            "required": ["params"],
        },
    )
    skills = tuple(dataclasses.replace(s, name="youhui-guide") if s.name == "price-promotion" else s for s in H.skills)
    loader = H.tool("load_skill")
    new_loader = dataclasses.replace(
        loader,
        input_schema={
            **loader.input_schema,
            "properties": {"skill": {"type": "string", "enum": [s.name for s in skills]}},
        },
    )
    new_h = H.replace(
        tools=tuple(new_price if t is price else new_loader if t is loader else t for t in H.tools), skills=skills
    )
    nm = hsa.NameMap(
        tools={"get_price": "chaxunJiage"},
        args={"get_price": {("product_id",): ("params", "itemId")}},
        skills={"price-promotion": "youhui-guide"},
    )
    out = hsa.rewrite_messages(trajectory(), H, new_h, nm, system_prompt="NEW SYSTEM")
    assert out[0] == {"role": "system", "content": "NEW SYSTEM"}
    assert out[1] == trajectory()[1]
    assert out[2]["reasoning_content"] == "问库存和价格，加载 youhui-guide。"
    assert out[2]["tool_calls"][0]["function"] == {"name": "load_skill", "arguments": {"skill": "youhui-guide"}}
    assert json.loads(out[3]["content"]) == {"skill": "youhui-guide", "content": H.skill("price-promotion").body}
    assert out[4]["reasoning_content"] == "先 get_stock 查 sku_id，再 chaxunJiage。"
    assert out[4]["tool_calls"][1]["function"] == {"name": "chaxunJiage", "arguments": {"params": {"itemId": "P0001"}}}
    assert out[6]["name"] == "chaxunJiage"
    assert json.loads(out[6]["content"]) == {"error": "工具 chaxunJiage 超时", "hook": "重试"}
    assert out[7] == trajectory()[7] and out[5] == trajectory()[5]


@pytest.mark.parametrize("name", hsa.transform_names())
def test_each_transform_is_valid_keeps_bindings_and_is_deterministic(name):
    transform = hsa.HSA_TRANSFORMS[name]
    new, nm = transform.apply(H, random.Random(7), {}, heldout=False)
    again, nm2 = transform.apply(H, random.Random(7), {}, heldout=False)
    assert (new, nm) == (again, nm2)
    assert new != H
    hsa.check_harness(new)
    assert world_bindings(new) == world_bindings(H)
    assert sorted(s.key for s in new.skills if s.key) == sorted(s.key for s in H.skills)


def test_rename_tools_updates_every_reference():
    new, nm = T.rename_tools(H, random.Random(3))
    assert set(nm.tools) == {t.name for t in H.tools} and not set(nm.tools.values()) & set(nm.tools)
    assert new.skill_tool == nm.tools["load_skill"]
    assert new.skill("price-promotion").allowed_tools == tuple(
        nm.tools[t] for t in H.skill("price-promotion").allowed_tools
    )
    text = (
        render_system_prompt(new)
        + "".join(s.body for s in new.skills)
        + json.dumps(new.openai_tools(), ensure_ascii=False)
    )
    for old in nm.tools:
        assert not re.search(rf"(?<![A-Za-z_]){old}(?![A-Za-z_])", text), old
    assert f"`{nm.tools['get_price']}`" in new.skill("price-promotion").body
    for t in new.tools:
        for path in t.arg_paths.values():
            assert resolve_path(t.input_schema, path) is not None


def test_restructure_nests_and_adds_optional_distractor_args():
    new, nm = T.restructure_schemas(H, random.Random(0), p_nest=1.0, p_distractor_args=1.0)
    for t in new.tools:
        old = H.tool(t.name)
        if t.impl == SKILL_TOOL_IMPL:
            assert t.arg_paths == old.arg_paths
            continue
        wrapper = next(iter(t.arg_paths.values()))[0]
        assert all(p == (wrapper, *old.arg_paths[a]) for a, p in t.arg_paths.items())
        assert nm.args[t.name] == {p: (wrapper, *p) for p in leaf_paths(old.input_schema)}
        extra = set(t.input_schema["properties"]) - {wrapper}
        assert extra and not extra & set(t.input_schema.get("required", []))


def test_distractors_and_skill_tool_enum():
    h1, _ = T.distractor_tools(H, random.Random(1), count=(2, 2))
    h2, _ = T.distractor_skills(h1, random.Random(1), count=(2, 2))
    extra = [t for t in h2.tools if t.impl.startswith(DISTRACTOR_PREFIX)]
    assert len(extra) == 2 and all(t.impl == DISTRACTOR_PREFIX + t.name for t in extra)
    assert [s.key for s in h2.skills].count("") == 2
    enum = h2.tool(h2.skill_tool).input_schema["properties"]["skill"]["enum"]
    assert enum[:7] == [s.name for s in H.skills] and sorted(enum[7:]) == sorted(
        s.name for s in h2.skills if s.key == ""
    )


def test_hook_params_tighter_limit_tightens_prompt_constraint():
    base = H.replace(
        hooks=(
            HookSpec("PostToolUseFailure", "retry_on_tool_error", None, {"max_attempts": 2}),
            HookSpec("Stop", "reply_length_limit", None, {"max_chars": 100}),
        )
    )
    base = base.replace(
        sections=tuple(
            dataclasses.replace(s, constraints=(Constraint("max_chars", {"n": 90}),)) if s.key == "style" else s
            for s in base.sections
        )
    )
    seen = set()
    for seed in range(40):
        new, _ = T.hook_params(base, random.Random(seed))
        limit = new.hooks[1].params["max_chars"]
        n = next(c.kwargs["n"] for c in new.constraints() if c.id == "max_chars")
        assert n == min(90, limit) and new.hooks[0].params["max_attempts"] != 2
        seen.add(limit)
    assert seen == {70, 80, 90, 110, 120, 140}


def test_behaviour_changed():
    msgs = trajectory()  # has a failed tool result
    n = len(msgs[-1]["content"])
    retry, _ = T.hook_params(H.replace(hooks=H.hooks[:1]), random.Random(0))
    retry = retry.replace(hooks=retry.hooks + H.hooks[1:])
    assert not hsa.behaviour_changed(H, H) and not hsa.behaviour_changed(H, H, msgs)
    assert hsa.behaviour_changed(H, retry) and hsa.behaviour_changed(H, retry, msgs)
    no_failure = [m for m in msgs if not (m["role"] == "tool" and "error" in m["content"])]
    assert not hsa.behaviour_changed(H, retry, no_failure)
    shorter = H.replace(
        hooks=tuple(
            dataclasses.replace(k, params={"max_chars": n - 1}) if k.handler == "reply_length_limit" else k
            for k in H.hooks
        )
    )
    assert hsa.behaviour_changed(H, shorter, msgs)
    assert not hsa.behaviour_changed(
        H,
        shorter.replace(
            hooks=tuple(
                dataclasses.replace(k, params={"max_chars": n}) if k.handler == "reply_length_limit" else k
                for k in H.hooks
            )
        ),
        msgs,
    )


def test_compose_rewrite_keeps_the_task():
    """50 draws: the rewritten trajectory calls the same world functions with the same canonical args."""
    want = canonical_calls(trajectory(), H)
    for seed in range(50):
        new, nm, applied = hsa.compose(H, random.Random(seed), split="heldout" if seed % 5 == 0 else "train")
        assert applied and new.version.startswith("2026.11.0+hsa.") and new.family.startswith("hsa-")
        out = hsa.rewrite_messages(trajectory(), H, new, nm)
        assert out[0]["content"] == render_system_prompt(new)
        assert canonical_calls(out, new) == want
        loaded = json.loads(out[3]["content"])
        assert (
            loaded["content"] == new.skill(loaded["skill"]).body and new.skill(loaded["skill"]).key == "price_promotion"
        )


def test_transformed_harnesses_pass_the_loader(tmp_path):
    for seed in range(12):
        new, _, _ = hsa.compose(H, random.Random(seed), split=("train", "heldout")[seed % 2])
        assert load_world_harness(dump_harness(new, tmp_path / str(seed))) == new


def test_heldout_families_never_in_train_always_in_heldout():
    train_pieces, heldout_pieces = set(), set()
    for seed in range(1000):
        new, nm, _ = hsa.compose(H, random.Random(seed), split="train")
        assert not hsa.is_heldout_harness(new, H), (seed, [t.name for t in new.tools])
        assert new.heading_style != "bracket" and (len(new.sections) < 2 or new.sections[-1].key != "persona")
        train_pieces |= {p.lower() for n in nm.tools.values() for p in re.split(r"[._-]|(?=[A-Z])", n) if p}
    for seed in range(1000):
        new, nm, applied = hsa.compose(H, random.Random(seed), split="heldout")
        assert hsa.heldout_forced() <= set(applied)
        assert new.heading_style == "bracket" and new.sections[-1].key == "persona"
        assert all(V.name_style(n) in V.HELDOUT_TOOL_STYLES for n in nm.tools.values())
        assert all(V.reserved_combo(*V.parse_tool_name(n)[1:2], *V.parse_tool_name(n)[2]) for n in nm.tools.values())
        assert all(V.reserved_combo(*V.parse_skill_name(n)[0], V.parse_skill_name(n)[1]) for n in nm.skills.values())
        assert hsa.is_heldout_harness(new, H)
        heldout_pieces |= {p for n in nm.tools.values() for p in re.split(r"[._]|(?=[A-Z])", n) if p}
    assert {p.lower() for p in heldout_pieces} <= train_pieces  # held-out = new combinations of seen pieces


def test_family_says_what_the_harness_is_and_rng_must_be_a_random():
    with pytest.raises(TypeError, match="rng must be a random.Random"):
        hsa.compose(H, 0)
    rewrite_only = hsa.HSAConfig(allowed=("rewrite_skills",))  # no forced held-out transform allowed
    new, _, applied = hsa.compose(H, random.Random(0), rewrite_only, split="heldout")
    assert applied == ("rewrite_skills",) and not hsa.is_heldout_harness(new, H) and new.family == "hsa-train"
    new, _, _ = hsa.compose(H, random.Random(0), split="heldout")
    assert hsa.is_heldout_harness(new, H) and new.family == "hsa-heldout"
    families = {hsa.compose(H, random.Random(seed), split="train")[0].family for seed in range(50)}
    assert families == {"hsa-train"}


def test_every_world_name_has_train_and_heldout_combinations():
    for impl in (*V.TOOL_NOUNS, "distractor"):
        assert V._split_combos(impl, False) and V._split_combos(impl, True), impl
    for key in (*V.SKILL_NOUNS, ""):
        assert V._split_skill_combos(key, False) and V._split_skill_combos(key, True), key


def test_config_and_split_errors():
    with pytest.raises(ValueError, match="unknown transform 'rename'"):
        hsa.HSAConfig(probs={"rename": 0.5})
    with pytest.raises(ValueError, match=r"probs\['rename_tools'\] = 1.5"):
        hsa.HSAConfig(probs={"rename_tools": 1.5})
    with pytest.raises(ValueError, match="split must be"):
        hsa.compose(H, random.Random(0), split="test")
    none = hsa.HSAConfig(default_p=0.0, at_least_one=False)
    assert hsa.compose(H, random.Random(0), none) == (H, hsa.NameMap(), ())
    only = hsa.HSAConfig(probs={"hook_params": 1.0}, default_p=0.0)
    assert hsa.compose(H, random.Random(0), only, exclude=("hook_params",))[2] == ()
    price = H.tool("get_price")
    broken = dataclasses.replace(price, arg_paths={"product_id": ("params", "product_id")})
    with pytest.raises(hsa.HSAError, match=r"tools\['get_price'\].arg_paths\['product_id'\]"):
        hsa.check_harness(H.replace(tools=tuple(broken if t is price else t for t in H.tools)))
    broken = dataclasses.replace(price, input_schema={"type": "object", "properties": {"product_id": {"type": 3}}})
    with pytest.raises(hsa.HSAError, match=r"tools\['get_price'\].input_schema: invalid JSON Schema"):
        hsa.check_harness(H.replace(tools=tuple(broken if t is price else t for t in H.tools)))
    with pytest.raises(hsa.HSAError, match=r"skills\['Bad_Name'\].name"):
        hsa.check_harness(H.replace(skills=(dataclasses.replace(H.skills[0], name="Bad_Name"),) + H.skills[1:]))


def test_rewritten_oracle_episodes_replay_exactly_in_the_env():
    """Oracle episodes (with tool faults) rewritten for HSA variants replay byte-for-byte in the env
    under the new harness, unless `behaviour_changed` says they must be re-rolled."""
    from hat_jax.sim.catalog import World
    from hat_jax.sim.env import EnvConfig, LiveStreamEnv
    from hat_jax.sim.oracle import OracleTeacher
    from hat_jax.sim.rollout import rollout
    from hat_jax.sim.viewers import sample_tasks

    world = World.generate(seed=0)
    env = LiveStreamEnv(world, EnvConfig(fault_rates={"error": 0.3, "timeout": 0.1, "empty": 0.0}))
    replayed = rerolled = 0
    for i, task in enumerate(sample_tasks(world, 30, seed=2)):
        episode = rollout(env, OracleTeacher(world), task, H)
        for j, split in enumerate(("train", "heldout")):
            new, nm, _ = hsa.compose(H, random.Random(100 * i + j), split=split)
            msgs = hsa.rewrite_messages(list(episode.messages), H, new, nm)
            if hsa.behaviour_changed(H, new, msgs):
                rerolled += 1
                continue
            assert env.reset(task, new) == msgs[:2]
            k = 2
            while k < len(msgs):
                result = env.step(msgs[k])
                k += 1
                assert [dict(m) for m in result.new_messages] == msgs[k : k + len(result.new_messages)], (
                    task.task_id,
                    split,
                )
                k += len(result.new_messages)
                if result.done:
                    break
            assert k == len(msgs)
            replayed += 1
    assert replayed >= 30 and rerolled >= 1


def test_registry_records_held_out_behaviour_and_parameters():
    assert hsa.transform_names() == ("rename_skills", "rewrite_skills", "rename_tools", "restructure_schemas",
                                     "distractor_tools", "distractor_skills", "restyle_prompt", "hook_params")
    assert {n: t.heldout for n, t in hsa.HSA_TRANSFORMS.items()} == {
        "rename_skills": "forced", "rewrite_skills": "none", "rename_tools": "forced", "restructure_schemas": "none",
        "distractor_tools": "family", "distractor_skills": "family", "restyle_prompt": "forced", "hook_params": "none"}
    assert hsa.heldout_forced() == {"rename_skills", "rename_tools", "restyle_prompt"}
    assert {n: dict(t.params) for n, t in hsa.HSA_TRANSFORMS.items() if t.params} == {
        "restructure_schemas": {"p_nest": 0.5, "p_distractor_args": 0.5},
        "distractor_tools": {"count": (1, 3)}, "distractor_skills": {"count": (1, 2)}}
    cfg = hsa.HSAConfig(params={"distractor_tools": {"count": [2, 4]}, "restructure_schemas": {"p_nest": 1}})
    assert cfg.params == {"distractor_tools": {"count": (2, 4)}, "restructure_schemas": {"p_nest": 1}}
    with pytest.raises(ValueError, match=r"params\['distractor_tools'\]: count = \(3, 2\): expected 0 <= min <= max"):
        hsa.HSAConfig(params={"distractor_tools": {"count": (3, 2)}})
    with pytest.raises(ValueError, match=r"params\['restructure_schemas'\]: p_nest = 1.5: expected a probability"):
        hsa.HSAConfig(params={"restructure_schemas": {"p_nest": 1.5}})
    with pytest.raises(ValueError, match=r"unknown transform 'rename'"):
        hsa.HSAConfig(params={"rename": {}})


def _register(heldout, fn, name=None):
    fn.__name__ = name or fn.__name__
    try:
        hsa.hsa_transform(heldout=heldout)(fn)
    finally:
        hsa.HSA_TRANSFORMS.pop(fn.__name__, None)


def test_an_incomplete_registry_entry_fails_naming_the_transform_and_the_key():
    def toy(h, rng, *, heldout=False, k=1):
        return h, hsa.NameMap()

    def toy_plain(h, rng, k=1):
        return h, hsa.NameMap()

    def toy_no_default(h, rng, *, k):
        return h, hsa.NameMap()

    with pytest.raises(ValueError, match="HSA transform 'toy': heldout = None; expected one of forced, family, none"):
        _register(None, toy)
    with pytest.raises(ValueError, match="HSA transform 'toy': heldout = 'none' takes no 'heldout' parameter"):
        _register("none", toy)
    with pytest.raises(ValueError, match="HSA transform 'toy_plain': parameter 'k' must be keyword-only"):
        _register("none", toy_plain)
    with pytest.raises(ValueError, match="HSA transform 'toy_no_default': parameter 'k' must be keyword-only"):
        _register("none", toy_no_default)
    with pytest.raises(ValueError, match="HSA transform 'toy_plain': heldout = 'forced' needs a 'heldout' parameter"):
        _register("forced", lambda h, rng, *, k=1: (h, hsa.NameMap()), name="toy_plain")
    with pytest.raises(ValueError, match="HSA transform 'rename_tools': already registered"):
        hsa.hsa_transform(heldout="forced")(T.rename_tools)
    assert "toy" not in hsa.HSA_TRANSFORMS and hsa.HSA_TRANSFORMS["rename_tools"].fn is T.rename_tools


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_compose_on_the_compact_harness(split, tmp_path):
    """HSA runs on the tiny world's harness unchanged: every draw loads back, keeps the description-first skill
    list, and the held-out split gives held-out families."""
    compact = world_harness("compact")
    families = set()
    for seed in range(30):
        new, _, _ = hsa.compose(compact, random.Random(seed), hsa.HSAConfig(), split)
        families.add(new.family)
        assert new.skill_listing == "description_first"
        prompt = render_system_prompt(new)
        assert all(f"-> {s.name}" in prompt for s in new.skills)
        if seed < 3:
            assert load_world_harness(dump_harness(new, tmp_path / f"{seed}")) == new
    assert families == ({"hsa-heldout"} if split == "heldout" else {"hsa-train"})
