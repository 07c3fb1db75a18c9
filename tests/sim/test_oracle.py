"""The oracle teacher in the real environment under the production harness and hand-made variants."""

from __future__ import annotations

import dataclasses

import pytest

from hat_jax.harness.constraints import check_all
from hat_jax.harness.hooks import claims_human, promises_refund
from hat_jax.harness.state import Constraint, PromptSection
from hat_jax.judges import phrases
from hat_jax.judges.rules import judge_episode
from hat_jax.sim.env import EnvConfig, LiveStreamEnv
from hat_jax.sim.executor import ToolExecution, error_payload, execute_tool_call
from hat_jax.sim.oracle import DEFAULT_NOISE, OracleConfig, OracleTeacher, final_behaviour_only, surface_of
from hat_jax.sim.oracle_replies import num
from hat_jax.sim.rollout import rollout
from hat_jax.sim.types import INTENTS
from hat_jax.sim.viewers import sample_tasks


@pytest.fixture(scope="module")
def tasks(world):
    return sample_tasks(world, 200, seed=11)


def _task(tasks, intent, k=0):
    return [t for t in tasks if t.intent == intent][k]


def _stated(value, reply):
    if isinstance(value, bool):
        return ("有货" in reply) if value else ("售罄" in reply)
    return (num(value) if isinstance(value, (int, float)) else value) in reply


def _calls(ep):
    return [(c.name, c.status) for c in ep.tool_calls]


class _FailingRunner:
    """Tool runner failing the first `n` calls of tool `name` with `status` (error type `kind`)."""

    def __init__(self, name, n, status="timeout", kind="timeout"):
        self.name, self.n, self.status, self.kind, self.seen = name, n, status, kind, 0

    def __call__(self, w, h, name, args, fault):
        if name == self.name and self.seen < self.n:
            self.seen += 1
            return ToolExecution(self.status, error_payload(self.kind, "工具调用失败"), {}, h.tool(name).impl)
        return execute_tool_call(w, h, name, args, fault=fault)


def test_noise_free_oracle_solves_200_tasks_over_all_intents(world, harness, tasks):
    assert {t.intent for t in tasks} == set(INTENTS)
    env, oracle = LiveStreamEnv(world), OracleTeacher(world)
    skill_tool = harness.tool(harness.skill_tool)
    for task in tasks:
        ep = rollout(env, oracle, task, harness)
        assert ep.outcome == "replied", (task.task_id, ep.outcome)
        first = ep.tool_calls[0]
        assert first.name == harness.skill_tool and first.status == "ok"
        assert first.arguments == surface_of(skill_tool, {"skill": harness.skill_by_key(task.skill_key).name})
        for group in task.gold_calls:
            for impl, args in group:
                assert any(c.impl == impl and c.status == "ok" and dict(c.canonical_args) == dict(args) for c in ep.tool_calls), (task.task_id, impl)
        for key, value in task.gold_facts.items():
            assert _stated(value, ep.reply), (task.task_id, key, value, ep.reply)
        assert all(ok for _, ok in check_all(harness, ep.reply, [c.impl for c in ep.tool_calls])), ep.reply
        assert not claims_human(ep.reply) and not promises_refund(ep.reply)
        assert all(m.get("reasoning_content") for m in ep.messages if m["role"] == "assistant")
        judgement = judge_episode(ep, harness)
        assert judgement.scores() == dict.fromkeys(judgement.scores(), 1.0), (task.task_id, judgement.reasons)


def test_behaviours_of_the_no_tool_intents(world, harness, tasks):
    replies = {i: rollout(LiveStreamEnv(world), OracleTeacher(world), _task(tasks, i), harness).reply
               for i in ("identity", "off_topic", "prompt_injection", "chit_chat", "complaint")}  # fmt: skip
    assert phrases.discloses_ai(replies["identity"]) and "AI" in replies["identity"]
    assert phrases.steers_back(replies["off_topic"]) and phrases.refuses(replies["off_topic"])
    assert phrases.refuses(replies["prompt_injection"]) and not phrases.promises_refund(replies["prompt_injection"])
    assert phrases.apologises(replies["complaint"]) and "无理由退货" in replies["complaint"]
    assert replies["chit_chat"].startswith("宝宝，") and "直播间" in replies["chit_chat"]


def _renamed(h):
    """Price tool -> lookup_live_price(item: {pid}); skill tool -> open_skill(skill_name); price skill renamed."""
    price, loader = h.tool_by_impl("get_price"), h.tool(h.skill_tool)
    skill = h.skill_by_key("price_promotion")
    new_skills = tuple(dataclasses.replace(s, name="pricing-helper") if s is skill else s for s in h.skills)
    obj = {"type": "object", "properties": {"pid": {"type": "string"}}, "required": ["pid"], "additionalProperties": False}
    new_price = dataclasses.replace(price, name="lookup_live_price", arg_paths={"product_id": ("item", "pid")},
                                    input_schema={"type": "object", "properties": {"item": obj}, "required": ["item"]})  # fmt: skip
    names = [s.name for s in new_skills]
    new_loader = dataclasses.replace(loader, name="open_skill", arg_paths={"skill": ("skill_name",)}, input_schema={
        "type": "object", "properties": {"skill_name": {"type": "string", "enum": names}}, "required": ["skill_name"]})
    tools = tuple(new_price if t is price else new_loader if t is loader else t for t in h.tools)
    return h.replace(tools=tools, skills=new_skills, skill_tool="open_skill", version="renamed")


def test_oracle_uses_the_names_of_the_current_harness(world, harness, tasks):
    h = _renamed(harness)
    for task in (_task(tasks, "price"), _task(tasks, "comparison")):
        ep = rollout(LiveStreamEnv(world), OracleTeacher(world), task, h)
        assert ep.tool_calls[0].name == "open_skill" and ep.tool_calls[0].arguments == {"skill_name": "pricing-helper"}
        assert ep.loaded_skills == ("pricing-helper",)
        price_calls = [c for c in ep.tool_calls if c.impl == "get_price"]
        assert [c.name for c in price_calls] == ["lookup_live_price"] * len(task.product_ids)
        assert [c.arguments for c in price_calls] == [{"item": {"pid": p}} for p in task.product_ids]
        assert all(c.status == "ok" for c in ep.tool_calls) and "get_price" not in {c.name for c in ep.tool_calls}
        assert all(_stated(v, ep.reply) for v in task.gold_facts.values())
        # each name is written after what the turn is for, in the harness's current names
        reasoning = [m["reasoning_content"] for m in ep.messages if m["role"] == "assistant" and m.get("tool_calls")]
        assert reasoning[0] in {f"观众在问{w}，{v}pricing-helper。" for w in ("价格", "比价")
                                for v in ("先加载技能", "先加载", "需要先加载技能")}
        assert "查价格，用lookup_live_price。" in reasoning


def test_retry_hook_retries_a_timeout_then_answers(world, harness, tasks):
    task = _task(tasks, "price")
    clean = rollout(LiveStreamEnv(world), OracleTeacher(world), task, harness)
    ep = rollout(LiveStreamEnv(world, tool_runner=_FailingRunner("get_price", 1)), OracleTeacher(world), task, harness)
    assert _calls(ep) == [("load_skill", "ok"), ("search_products", "ok"), ("get_price", "timeout"), ("get_price", "ok")]
    assert ("PostToolUseFailure", "retry_on_tool_error", "retry 1/2") in ep.hook_events
    assert ep.reply == clean.reply and _stated(task.gold_facts["live_price"], ep.reply)
    # SFT post-processing: the failed call and the retry turn collapse into the clean trajectory ...
    assert list(final_behaviour_only(ep, keep_full_share=0.0)) == list(clean.messages)
    # ... unless the draw keeps the full retry.
    assert list(final_behaviour_only(ep, keep_full_share=1.0)) == list(ep.messages)


def test_exhausted_retries_or_no_retry_hook_give_an_honest_reply(world, harness, tasks):
    task = _task(tasks, "price")
    no_retry = harness.replace(hooks=tuple(h for h in harness.hooks if h.handler != "retry_on_tool_error"))
    cases = [
        (harness, _FailingRunner("get_price", 2), ["timeout", "timeout"]),
        (no_retry, _FailingRunner("get_price", 1), ["timeout"]),
        (harness, _FailingRunner("get_price", 1, "error", "not_found"), ["error"]),  # business error: no retry
    ]
    for h, runner, statuses in cases:
        ep = rollout(LiveStreamEnv(world, tool_runner=runner), OracleTeacher(world), task, h)
        assert [s for n, s in _calls(ep) if n == "get_price"] == statuses
        assert ep.outcome == "replied" and phrases.is_conservative(ep.reply), ep.reply
        assert not any(ch.isdigit() for ch in ep.reply)  # no invented price
        assert judge_episode(ep, h).accuracy == 1
        assert final_behaviour_only(ep, keep_full_share=0.0) == ep.messages  # nothing succeeded: kept whole


def test_random_faults_never_make_the_oracle_invent_facts(world, harness, tasks):
    env = LiveStreamEnv(world, EnvConfig(fault_rates={"error": 0.15, "timeout": 0.1, "empty": 0.1}))
    retried = 0
    for task in tasks[:120]:
        ep = rollout(env, OracleTeacher(world), task, harness)
        assert ep.outcome == "replied"
        j = judge_episode(ep, harness)
        assert j.accuracy == 1, (task.task_id, j.reasons)
        failed = [c for c in ep.tool_calls if c.status != "ok"]
        if failed and not phrases.is_conservative(ep.reply):
            retried += 1
            assert all(any(d.name == c.name and d.arguments == c.arguments and d.status == "ok" for d in ep.tool_calls) for c in failed)
            assert all(_stated(v, ep.reply) for v in task.gold_facts.values()), ep.reply
    assert retried >= 5


def test_tool_order_constraint_inserts_the_first_tool(world, harness, tasks):
    sections = harness.sections + (PromptSection("rules2", "顺序", "", (Constraint("tool_order", {"first": "get_promotions", "then": "get_price"}),)),)
    h = harness.replace(sections=sections)
    ep = rollout(LiveStreamEnv(world), OracleTeacher(world), _task(tasks, "price"), h)
    assert [c.impl for c in ep.tool_calls] == ["load_skill", "search_products", "get_promotions", "get_price"]
    assert judge_episode(ep, h).tco == 1


def test_reply_obeys_every_reply_constraint_of_a_changed_prompt(world, harness, tasks):
    style = PromptSection("style", "风格", "", tuple(Constraint(i, kw) for i, kw in (
        ("start_with", {"phrase": "家人们好"}), ("address_term", {"term": "亲"}), ("end_with", {"phrase": "欢迎下单"}),
        ("must_include", {"phrase": "直播间"}), ("no_exclamation", {}), ("min_chars", {"n": 30}), ("max_chars", {"n": 90}),
        ("forbidden_phrase", {"phrase": "哦"}))))  # fmt: skip
    h = harness.replace(sections=tuple(s for s in harness.sections if s.key != "style") + (style,))
    for task in tasks[:60]:
        ep = rollout(LiveStreamEnv(world), OracleTeacher(world), task, h)
        assert ep.reply.startswith("家人们好，亲，") and ep.reply.endswith("欢迎下单"), ep.reply
        assert all(ok for _, ok in check_all(h, ep.reply, [c.impl for c in ep.tool_calls])), ep.reply
        assert all(_stated(v, ep.reply) for v in task.gold_facts.values()), ep.reply


@pytest.mark.parametrize("kind", ["skip_skill", "wrong_tool", "skip_tool", "wrong_fact", "ungrounded_promise", "over_length"])
def test_each_noise_kind_makes_measurably_wrong_episodes(world, harness, tasks, kind):
    cfg = OracleConfig(**{f"p_{kind}": 1.0})
    h = harness.replace(hooks=()) if kind in ("ungrounded_promise", "over_length") else harness  # no hook to fix it
    wrong = applicable = 0
    for task in tasks[:80]:
        ep = rollout(LiveStreamEnv(world), OracleTeacher(world, cfg), task, h)
        j = judge_episode(ep, h)
        if kind == "skip_skill":
            applicable, wrong = applicable + 1, wrong + (not ep.loaded_skills and j.skill_selection == 0)
        elif kind in ("wrong_tool", "skip_tool"):
            if any("product_id" in a for g in task.gold_calls for i, a in g if i != "search_products"):
                applicable, wrong = applicable + 1, wrong + (j.tc == 0)
        elif kind == "wrong_fact":
            if any(not isinstance(v, bool) for v in task.gold_facts.values()):
                applicable, wrong = applicable + 1, wrong + (j.accuracy == 0 or j.effectiveness < 1)
        elif kind == "ungrounded_promise":
            applicable, wrong = applicable + 1, wrong + (j.accuracy == 0 and promises_refund(ep.reply))
        else:
            applicable, wrong = applicable + 1, wrong + (j.llm == 0 and len(ep.reply) > 120)
    assert applicable >= 30 and wrong == applicable, (kind, wrong, applicable)


def test_a_stop_hook_block_gets_a_clean_revision_that_collapses(world, harness, tasks):
    task = _task(tasks, "price")
    clean = rollout(LiveStreamEnv(world), OracleTeacher(world), task, harness)
    ep = rollout(LiveStreamEnv(world), OracleTeacher(world, OracleConfig(p_ungrounded_promise=1.0)), task, harness)
    assert ("Stop", "compliance_check", "block refund_promise") in ep.hook_events
    assert ep.outcome == "replied" and ep.reply == clean.reply
    collapsed = final_behaviour_only(ep, keep_full_share=0.0)
    assert [m["content"] for m in collapsed] == [m["content"] for m in clean.messages]


def test_same_seed_same_episode_and_the_keep_full_share(world, harness, tasks):
    env = LiveStreamEnv(world, EnvConfig(fault_rates={"error": 0.2, "timeout": 0.0, "empty": 0.1}))

    def run(cfg, task):
        ep = rollout(env, OracleTeacher(world, cfg), task, harness)
        return ep.messages, [(c.name, dict(c.arguments), c.status) for c in ep.tool_calls], ep.reply

    runs = [(run(DEFAULT_NOISE, t), run(DEFAULT_NOISE, t), run(dataclasses.replace(DEFAULT_NOISE, seed=9), t)) for t in tasks[:60]]
    assert all(a == b for a, b, _ in runs)
    assert any(a != c for a, _, c in runs)  # another oracle seed makes other mistakes
    retried = [ep for t in tasks for ep in [rollout(env, OracleTeacher(world), t, harness)]
               if any(c.status != "ok" for c in ep.tool_calls) and ep.tool_calls[-1].status == "ok"]  # fmt: skip
    full = sum(final_behaviour_only(ep, keep_full_share=0.25) == ep.messages for ep in retried)
    assert len(retried) >= 20 and 0 < full < len(retried) / 2


def test_bad_config_and_missing_task_raise(world, harness):
    with pytest.raises(ValueError, match="p_wrong_fact"):
        OracleConfig(p_wrong_fact=1.5)
    with pytest.raises(ValueError, match="task=None"):
        OracleTeacher(world).act([{"role": "user", "content": "x"}], harness, None)


def test_noisy_replies_never_leak_none_or_nan(world, harness):
    # 2000 noisy episodes over all intents, with random tool faults: every reply and reasoning is
    # well-formed text (a skipped get_price on a comparison names the product by position).
    cfg = OracleConfig(p_skip_skill=0.3, p_wrong_tool=0.3, p_skip_tool=0.3, p_wrong_fact=0.3,
                       p_ungrounded_promise=0.3, p_over_length=0.3)  # fmt: skip
    env = LiveStreamEnv(world, EnvConfig(fault_rates={"error": 0.1, "timeout": 0.05, "empty": 0.05}))
    tasks = sample_tasks(world, 2000, seed=3)
    assert {t.intent for t in tasks} == set(INTENTS)
    texts = []
    for task in tasks:
        ep = rollout(env, OracleTeacher(world, cfg), task, harness)
        turns = [m for m in ep.messages if m.get("role") == "assistant"]
        texts += [m.get(k) or "" for m in turns for k in ("content", "reasoning_content")]
    leaks = [t for t in texts if "none" in t.casefold() or "nan" in t.casefold()]
    assert len(texts) > 4000 and leaks == []


def test_skipped_comparison_price_names_the_product_by_position(world, harness, tasks):
    task = _task(tasks, "comparison")
    ep = rollout(LiveStreamEnv(world), OracleTeacher(world, OracleConfig(p_skip_tool=1.0)), task, harness)
    prices = [c.canonical_args["product_id"] for c in ep.tool_calls if c.impl == "get_price"]
    assert len(prices) == 1  # one get_price skipped: its product's name was never looked up
    a, b = (task.gold_facts["live_price_1"], task.gold_facts["live_price_2"])
    missing = "第一款" if prices == [task.product_ids[1]] else "第二款"
    assert f"{missing}直播价" in ep.reply and "None" not in ep.reply
    if a != b:
        cheaper_missing = (a < b) == (missing == "第一款")
        assert (f"{missing}更便宜" in ep.reply) is cheaper_missing
