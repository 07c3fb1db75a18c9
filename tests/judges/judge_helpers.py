"""Small hand-made harness, tasks and episodes for the judge tests."""

from __future__ import annotations

from hat_jax.harness.state import Constraint, HarnessState, PromptSection, Skill, Tool
from hat_jax.sim.types import Episode, Task, ToolCallRecord

# surface name -> impl (surface names differ from impls on purpose)
TOOLS = {"load": "load_skill", "jiage": "get_price", "kucun": "get_stock", "youhui": "get_promotions",
         "wuliu": "estimate_shipping", "tianqi": "distractor:tianqi", "sousuo": "search_products"}


def harness(*constraints: Constraint) -> HarnessState:
    tools = tuple(Tool(n, n, {"type": "object", "properties": {}}, impl) for n, impl in TOOLS.items())
    skills = (Skill("jiage-skill", "价格", "查价格", key="price_promotion"), Skill("chima", "尺码", "查尺码", key="size_advice"))
    sections = (PromptSection("style", "风格", "简短", constraints=tuple(constraints)),)
    return HarnessState("t", "t-1", "load", skills, tools, sections)


def task(**kw) -> Task:
    base = dict(task_id="t-1", seed=0, intent="price", message="这条裙子多少钱？", skill_key="price_promotion",
                product_ids=("P1",), gold_calls=((("get_price", {"product_id": "P1"}),),), gold_facts={"live_price": 199.0})
    base.update(kw)
    return Task(**base)


def call(name: str, args: dict | None = None, status: str = "ok", result=None, canonical: dict | None = None) -> ToolCallRecord:
    args = args or {}
    impl = TOOLS.get(name, "") if status != "unknown_tool" else ""
    canon = dict(args) if canonical is None and status not in ("invalid_arguments", "unknown_tool") else (canonical or {})
    return ToolCallRecord(round=1, name=name, impl=impl, arguments=args, canonical_args=canon, status=status, result=result or {})


SKILL = call("load", {"name": "jiage-skill"}, result={"skill": "jiage-skill", "content": "查价格"})
PRICE = call("jiage", {"product_id": "P1"}, result={"product_id": "P1", "list_price": 299.0, "live_price": 199.0})


def episode(reply: str, calls=(SKILL, PRICE), t: Task | None = None, skills=("jiage-skill",), outcome="replied") -> Episode:
    t = t or task()
    return Episode(task=t, harness_version="t-1", messages=({"role": "user", "content": t.message},), tool_calls=tuple(calls),
                   reply=reply, loaded_skills=tuple(skills), outcome=outcome)
