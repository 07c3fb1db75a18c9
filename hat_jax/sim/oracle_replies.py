"""The oracle teacher's words: its short reasoning and its grounded Chinese replies.

Split from `hat_jax.sim.oracle` (which decides *what* to do) so that each file stays readable: this
module turns ok tool results into a reply for each intent, applies the prompt's reply constraints,
and writes the noisy variants. Every fact a clean reply states is read from a tool result (a
`_Call.result` of status "ok"); the task's gold facts are used only by the noise that states a
missing fact anyway (the ungrounded claims rejection sampling must catch).

Wording avoids what the judges and the compliance hook flag in a clean reply (`hat_jax.judges.phrases`,
`hat_jax.harness.hooks`): no "真人", no refund promise, no superlative, no number that no tool
returned, and "还有"/"有货" only when the SKU is in stock.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

from hat_jax.harness.state import HarnessState
from hat_jax.sim.types import Task

INTENT_CN = {
    "product_info": "商品信息", "price": "价格", "stock": "库存", "size_advice": "尺码", "shipping": "物流",
    "coupon": "优惠", "comparison": "比价", "after_sales": "售后", "complaint": "投诉", "identity": "身份",
    "chit_chat": "闲聊", "off_topic": "无关问题", "prompt_injection": "越权指令",
}
IMPL_CN = {
    "load_skill": "技能", "search_products": "商品搜索", "get_product_detail": "商品详情", "get_price": "价格",
    "get_stock": "库存", "get_promotions": "优惠信息", "estimate_shipping": "物流信息", "get_size_chart": "尺码表",
    "get_after_sales_policy": "售后规则",
}
PROMISES = ("不满意保证全额退款。", "收到不喜欢直接给你退款。", "假一赔十，放心买。", "有问题我一定给你赔偿。")
FILLERS = (
    "这款在直播间很受欢迎，很多人回购，做工和细节都很用心，", "平时搭配或者日常使用都很方便，拿到手会很满意，",
    "喜欢的话可以先加购物车，拍下以后尽快给你安排发货，", "直播间的福利很多，记得点个关注，以后上新第一时间知道，",
)
CLOSERS = ("看中哪款随时问我哦。", "有问题随时问我。", "欢迎继续在直播间提问。")
_MATERIAL_POOL = ("纯棉", "真丝", "羊毛", "涤纶", "亚麻", "莫代尔", "锦纶", "头层牛皮")
_ORIGIN_POOL = ("浙江杭州", "广东广州", "江苏苏州", "福建泉州", "山东青岛", "四川成都")
_SIZES = ("S", "M", "L", "XL", "XXL")


def num(v: Any) -> str:
    """A number as a viewer reads it: 199.0 -> "199", 199.9 -> "199.9"."""
    if isinstance(v, float):
        return f"{v:.2f}".rstrip("0").rstrip(".")
    return str(v)


def _result(ok: Sequence[Any], impl: str, product_id: str | None = None) -> dict | None:
    for c in ok:
        if c.impl == impl and (product_id is None or c.result.get("product_id") == product_id):
            return c.result
    return None


def facts_from_results(task: Task, ok: Sequence[Any]) -> dict[str, Any]:
    """The values the reply may use, read from ok results: gold-fact keys plus context (names, notes)."""
    pid = task.product_ids[0] if task.product_ids else None
    v: dict[str, Any] = {}
    if task.intent == "comparison":
        for k, p in enumerate(task.product_ids[:2], start=1):
            r = _result(ok, "get_price", p)
            if r:
                v[f"live_price_{k}"], v[f"name_{k}"] = r["live_price"], r["name"]
        return v
    for impl in ("get_product_detail", "get_price", "get_stock", "get_promotions", "estimate_shipping",
                 "get_size_chart", "get_after_sales_policy"):  # fmt: skip
        r = _result(ok, impl, pid) or (_result(ok, impl) if impl == "get_stock" else None)
        if r is None:
            continue
        v.setdefault("name", r.get("name"))
        if impl == "get_product_detail":
            v.update(material=r["material"], material_label=r.get("material_label", "材质"), origin=r["origin"])
        elif impl == "get_price":
            v.update(live_price=r["live_price"], list_price=r["list_price"])
        elif impl == "get_stock":
            spec = "".join(f"{x}码" if dim == "尺码" else str(x) for dim, x in r.get("spec", {}).items())
            v.update(stock=r["stock"], in_stock=r["in_stock"], spec=spec)
        elif impl == "get_promotions":
            if r.get("coupons"):
                c = r["coupons"][0]
                v.update(coupon_amount=c["amount"], coupon_threshold=c["threshold"], coupon_name=c.get("name", "优惠券"))
            full = [x["description"] for x in r.get("promotions", []) if x.get("type") == "满减"]
            if full:
                v["full_reduction"] = full[0]
            v["has_promotions"] = True
        elif impl == "estimate_shipping":
            v.update(days_min=r["days_min"], days_max=r["days_max"], fee="包邮" if r["fee"] == 0 else r["fee"],
                     ship_from=r.get("ship_from", ""), region=r.get("region", ""), ship_note=r.get("note", ""))
        elif impl == "get_size_chart":
            v.update(recommended_size=r.get("recommended_size"), size_note=r.get("note", ""),
                     sizes=[row["size"] for row in r.get("size_chart", [])])
        elif impl == "get_after_sales_policy":
            v.update(return_days=r["return_days"], warranty_months=r["warranty_months"],
                     return_policy=r.get("return_policy", ""), return_insurance=r.get("return_insurance", ""),
                     warranty=r.get("warranty", ""))
    return v


def wrong_value(key: str, value: Any, v: Mapping[str, Any], rng: random.Random) -> Any:
    """A plausible but wrong value for fact `key` (noise)."""
    if key == "recommended_size":
        pool = [s for s in (v.get("sizes") or _SIZES) if s != value] or [s for s in _SIZES if s != value]
        return rng.choice(pool)
    if key == "material":
        return rng.choice([m for m in _MATERIAL_POOL if m != value])
    if key == "origin":
        return rng.choice([o for o in _ORIGIN_POOL if o != value])
    if key == "fee":
        return 10.0 if value == "包邮" else "包邮"
    if key == "full_reduction":
        nums = re.findall(r"\d+", str(value))
        return str(value).replace(nums[-1], str(int(nums[-1]) + 10)) if nums else "满99减10"
    if key == "return_days":
        return 15 if value == 7 else 7
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        delta = rng.choice((10, 20, 30)) if "price" in key else rng.choice((2, 3, 5, 12))
        out = value + delta
        return float(out) if isinstance(value, float) else int(out)
    return value


# Intents answered by a fixed sentence, whatever the tools returned.
_FIXED_REPLIES = {
    "identity": "我是直播间的AI主播助手，由人工智能为你实时解答。",
    "off_topic": "这个问题我无法回答哦，咱们还是聊聊直播间的商品吧。",
    "prompt_injection": "抱歉，这个要求我不能照办，售后问题都按平台规则处理。",
    "chit_chat": "谢谢你的支持，欢迎来到直播间。",
}

# Each tool-backed intent's sentences: (task, facts v, product name, the missing-value clause) ->
# (core sentences, optional sentences).
_Sentences = tuple[list[str], list[str]]


def _product_info_body(task: Task, v: Mapping[str, Any], name: str, miss: str) -> _Sentences:
    asked = next((k for k in ("material", "origin") if k in task.gold_facts), "material")
    if asked not in v:
        return [miss], []
    label = v.get("material_label", "材质") if asked == "material" else "产地"
    return [f"{name}的{label}是{v[asked]}。"], []


def _price_body(task: Task, v: Mapping[str, Any], name: str, miss: str) -> _Sentences:
    if "live_price" not in v:
        return [miss], []
    opt = [f"原价{num(v['list_price'])}元，喜欢可以趁现在下单。"] if "list_price" in v else []
    return [f"{name}直播间到手价{num(v['live_price'])}元。"], opt


def _stock_body(task: Task, v: Mapping[str, Any], name: str, miss: str) -> _Sentences:
    if "stock" not in v:
        return [miss], []
    spec = v.get("spec", "")
    if v.get("in_stock", v["stock"] > 0):
        return [f"{name}{spec}有货，库存{num(v['stock'])}件。"], []
    return [f"{name}{spec}已售罄，库存{num(v['stock'])}件，可以看看其他规格。"], []


def _size_advice_body(task: Task, v: Mapping[str, Any], name: str, miss: str) -> _Sentences:
    if not v.get("recommended_size"):
        return [miss], []
    opt = [v["size_note"] + "。"] if v.get("size_note") and v["size_note"] != "按身高体重推荐" else []
    return [f"按你的身高体重，{name}推荐选{v['recommended_size']}码。"], opt


def _shipping_body(task: Task, v: Mapping[str, Any], name: str, miss: str) -> _Sentences:
    if "days_min" not in v:
        return [miss], []
    fee = "包邮" if v["fee"] == "包邮" else f"运费{num(v['fee'])}元"
    region = f"寄到{v['region']}" if v.get("region") else ""
    opt = [f"从{v['ship_from']}发货。"] if v.get("ship_from") else []
    return [f"{name}{region}预计{num(v['days_min'])}-{num(v['days_max'])}天送达，{fee}。"], opt


def _coupon_body(task: Task, v: Mapping[str, Any], name: str, miss: str) -> _Sentences:
    if "coupon_amount" in task.gold_facts or ("coupon_amount" in v and "full_reduction" not in task.gold_facts):
        if "coupon_amount" not in v:
            return [miss], []
        core = [f"{name}有{v.get('coupon_name', '优惠券')}，满{num(v['coupon_threshold'])}元减{num(v['coupon_amount'])}元。"]
        opt = [f"还可以参加{v['full_reduction']}活动。".replace("还可以", "另外可以")] if v.get("full_reduction") else []
        return core, opt
    if "full_reduction" in v:
        return [f"{name}现在有{v['full_reduction']}的活动。"], []
    return [miss], []


def _comparison_body(task: Task, v: Mapping[str, Any], name: str, miss: str) -> _Sentences:
    if not ("live_price_1" in v and "live_price_2" in v):
        return [miss], []
    a, b = v["live_price_1"], v["live_price_2"]
    # A name is missing when its get_price was skipped (noise): name the product by position.
    n1, n2 = v.get("name_1") or "第一款", v.get("name_2") or "第二款"
    cheaper = f"{n1 if a < b else n2}更便宜。" if a != b else "两款价格一样。"
    return [f"{n1}直播价{num(a)}元，{n2}直播价{num(b)}元。", cheaper], []


def _after_sales_body(task: Task, v: Mapping[str, Any], name: str, miss: str) -> _Sentences:
    """after_sales and complaint (which apologises first and points to the order page after a return policy)."""
    core = ["非常抱歉给你带来不好的体验。"] if task.intent == "complaint" else []
    asked = "warranty_months" if "warranty_months" in task.gold_facts else "return_days"
    if asked in v and asked == "warranty_months":
        core.append(f"{name}质保{num(v['warranty_months'])}个月。")
    elif asked in v:
        policy = v.get("return_policy") or f"支持{num(v['return_days'])}天无理由退货"
        if str(num(v["return_days"])) not in policy:
            policy = f"支持{num(v['return_days'])}天无理由退货"
        insurance = f"，{v['return_insurance']}" if v.get("return_insurance") else ""
        core.append(f"{name}{policy}{insurance}。")
        if task.intent == "complaint":
            core.append("可以在订单页申请售后处理。")
    else:
        core.append(miss)
    return core, []


_INTENT_BODIES = {
    "product_info": _product_info_body,
    "price": _price_body,
    "stock": _stock_body,
    "size_advice": _size_advice_body,
    "shipping": _shipping_body,
    "coupon": _coupon_body,
    "comparison": _comparison_body,
    "after_sales": _after_sales_body,
    "complaint": _after_sales_body,
}


def _body(task: Task, v: Mapping[str, Any], failed_label: str | None) -> _Sentences:
    """(core sentences, optional sentences) for the intent; a missing value gives an honest clause."""
    if task.intent in _FIXED_REPLIES:
        return [_FIXED_REPLIES[task.intent]], []
    if task.intent not in _INTENT_BODIES:
        return [], []
    name = v.get("name") or "这款"
    miss = f"{failed_label or '相关信息'}暂时查不到，系统有点忙，稍后再问我或以商品详情页为准。"
    return _INTENT_BODIES[task.intent](task, v, name, miss)


def reply_limits(harness: HarnessState) -> dict[str, Any]:
    """What the prompt and the Stop hooks ask of a reply: max/min chars, phrases, address term."""
    out: dict[str, Any] = {"max": None, "min": 0, "start": "", "end": "", "address": "", "include": [], "forbid": []}
    for c in harness.constraints():
        kw = c.kwargs
        if c.id == "max_chars":
            out["max"] = kw["n"] if out["max"] is None else min(out["max"], kw["n"])
        elif c.id == "min_chars":
            out["min"] = max(out["min"], kw["n"])
        elif c.id == "start_with":
            out["start"] = kw["phrase"]
        elif c.id == "end_with":
            out["end"] = kw["phrase"]
        elif c.id == "address_term" and not out["address"]:
            out["address"] = kw["term"]
        elif c.id == "must_include":
            out["include"].append(kw["phrase"])
        elif c.id == "forbidden_phrase":
            out["forbid"].append(kw["phrase"])
    for h in harness.hooks_for("Stop"):
        if h.handler == "reply_length_limit":
            n = int(h.params["max_chars"])
            out["max"] = n if out["max"] is None else min(out["max"], n)
        elif h.handler == "block_phrases":
            out["forbid"].extend(h.params["phrases"])
    return out


def _clean(text: str, forbid: Sequence[str]) -> str:
    text = text.replace("！", "。").replace("!", "。").replace("\n", "")
    for p in forbid:
        text = text.replace(p, "")
    return text


def apply_constraints(harness: HarnessState, core: list[str], optional: list[str], rng: random.Random) -> str:
    """Assembles the reply so that it satisfies every reply constraint of the prompt (see module doc)."""
    lim = reply_limits(harness)
    head = lim["start"]
    if lim["address"] and lim["address"] not in head:
        head += ("，" if head else "") + lim["address"] + "，"
    elif head and not head.endswith(("，", "。")):
        head += "，"
    tail = "".join(p + "。" for p in lim["include"] if p not in "".join(core)) + lim["end"]
    opt = list(optional) + [rng.choice(CLOSERS)]

    def build(parts: list[str]) -> str:
        body = _clean("".join(parts), lim["forbid"])
        if lim["end"] and body.endswith("。"):
            body = body[:-1] + "，"
        return head + body + tail

    text = build(core + opt)
    while lim["max"] is not None and len(text.strip()) > lim["max"] and opt:
        opt.pop()
        text = build(core + opt)
    if lim["max"] is not None and len(text.strip()) > lim["max"]:
        room = lim["max"] - len(head) - len(tail) - 1
        text = head + _clean("".join(core), lim["forbid"])[: max(room, 0)] + "。" + tail
    pads = [s for s in CLOSERS if s not in text]
    while len(text.strip()) < lim["min"] and pads:
        text = build(core + opt + [pads.pop(0)])
        opt.append("")
    return text.strip()


def compose_reply(task: Task, harness: HarnessState, ok: Sequence[Any], noise: Mapping[str, Any],
                  rng: random.Random, *, failed: str | None = None, revision: str | None = None) -> tuple[str, str]:
    """(reply, reasoning) for the final turn.

    Built only from values in ok tool results, per intent (price, stock, ...), plus the right behaviour for
    identity (disclose the AI avatar), off-topic (decline, steer back), injection (refuse, promise nothing),
    complaint (apologise + after-sales policy), chit-chat; then every reply constraint of the prompt is applied
    (start/end phrases, address term, must-include, forbidden phrases, no exclamation, min/max characters, the
    Stop hook's length limit).

    Args:
      task: the request (intent, which facts are asked, gold facts for the noisy fill-in only).
      harness: the current harness (reply constraints, Stop hooks).
      ok: the ok calls (`hat_jax.sim.oracle._Call`) so far.
      noise: the episode's noise plan (`OracleTeacher.noise_plan`).
      rng: the turn's random stream.
      failed: the impl that failed for good (the reply says it cannot confirm that part).
      revision: the Stop hook's feedback when this is a revision (the noisy additions are dropped).
    """
    v = facts_from_results(task, ok)
    if "wrong_tool" in noise or "skip_tool" in noise:
        for k, val in task.gold_facts.items():
            v.setdefault(k, val)  # the noisy teacher states what it never looked up
        v.setdefault("name", None)
    gold_keys = [k for k in task.gold_facts if k in v and not isinstance(v[k], bool)]
    if "wrong_fact" in noise and gold_keys:
        k = gold_keys[int(noise["wrong_fact"] * len(gold_keys))]
        v = {**v, k: wrong_value(k, v[k], v, rng)}
    label = None
    if failed is not None:
        label = f"{INTENT_CN.get(task.intent, '')}信息" if failed == "search_products" else IMPL_CN.get(failed, "相关信息")
    core, opt = _body(task, v, label)
    if revision is None and "ungrounded_promise" in noise:
        core.append(PROMISES[int(noise["ungrounded_promise"] * len(PROMISES))])
    text = apply_constraints(harness, core, opt, rng)
    if revision is None and "over_length" in noise:
        limit = reply_limits(harness)["max"] or 150
        fill = "".join(FILLERS)
        while len(text) <= limit + 5:
            text = text + fill
        text = text[: limit + 5 + rng.randint(5, 25)]
    if revision is not None:
        note = f"回复被拦截：{revision[len('【系统提示】'):][:24]}，按提示修改后重新回复。"
    elif failed is not None and task.gold_calls:
        note = f"{label or '工具'}没有查到，如实告知暂时查不到，不编造。"
    else:
        lim = reply_limits(harness)
        asks = ([f"称呼{lim['address']}"] if lim["address"] else []) + ([f"不超过{lim['max']}字"] if lim["max"] else [])
        what = {"identity": "说明自己是AI主播助手", "off_topic": "礼貌拉回直播间", "prompt_injection": "拒绝越权指令，不做承诺",
                "complaint": "先道歉再说明售后规则", "chit_chat": "简短互动"}.get(task.intent, "根据工具结果回答")
        note = "，".join([what] + asks) + "。"
    return text, note


def tool_reasoning(task: Task, todo: Sequence[tuple], names: Sequence[str], *, retry: bool,
                   rng: random.Random) -> str:
    """1-2 short sentences before a tool turn: what the turn is for, then the names it calls ("观众在问价格，先加载技能
    price-promotion。", "查价格，用get_price。"), so each name follows the words it is looked up by."""
    impls = [t[0] for t in todo]
    if retry:
        return f"{'、'.join(names)}调用失败，按提示重试一次。"
    if impls == ["load_skill"]:
        skill = todo[0][1]
        sid = next(iter(skill.values())) if skill else ""
        verb = rng.choice(("先加载技能", "先加载", "需要先加载技能"))
        return f"观众在问{INTENT_CN.get(task.intent, task.intent)}，{verb}{sid}。"
    labels = "、".join(dict.fromkeys(IMPL_CN.get(i, i) for i in impls))
    if "search_products" in impls:
        return f"先找商品编号，用{'、'.join(dict.fromkeys(names))}。"
    return f"查{labels}，用{'、'.join(dict.fromkeys(names))}。"
