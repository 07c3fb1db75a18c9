"""The reading metrics on hand-made episodes: valid names under a renamed harness, the gold chain in order, an
abstaining episode, and a suite's pooled figures."""

import dataclasses

import pytest
from judge_helpers import PRICE, SKILL, call, episode, harness, task

from hat_jax.judges import rules
from hat_jax.judges.reading import EpisodeReading, episode_reading, reading_scores, valid_name

H = harness()
REPLY = "这条裙子直播间到手价199元哦"


def renamed():
    """H with the price tool and the price skill renamed, as HSA renames them under Variant QA."""
    tools = tuple(dataclasses.replace(t, name="chaxun-jiage") if t.name == "jiage" else t for t in H.tools)
    skills = tuple(dataclasses.replace(s, name="price-x") if s.name == "jiage-skill" else s for s in H.skills)
    return H.replace(tools=tools, skills=skills)


def test_original_names_under_a_renamed_harness_are_invalid():
    r = renamed()
    # The model calls the names it memorised: the loader exists, its skill id does not; the price tool does not.
    old_skill = call("load", {"name": "jiage-skill"}, status="error", canonical={"skill": "jiage-skill"})
    old_price = call("jiage", {"product_id": "P1"}, status="unknown_tool")
    e = episode(REPLY, calls=(old_skill, old_price), skills=())
    assert [valid_name(c, r) for c in e.tool_calls] == [False, False]
    # Nothing returned the price: not fetched, so no relaying to judge; 199 stated ungrounded is no abstention.
    assert episode_reading(e, r) == EpisodeReading(calls=2, valid_calls=0, skill=0, chain=0, fetched=0, relayed=None,
                                                   abstained=0)
    # The same calls under the harness they belong to are valid (the reading is judged per harness).
    assert [valid_name(c, H) for c in e.tool_calls] == [True, True]
    # A model that reads the renamed harness: both names valid, the right skill first, the chain done.
    new_skill = call("load", {"name": "price-x"}, result={"skill": "price-x", "content": "查价格"})
    new_price = dataclasses.replace(PRICE, name="chaxun-jiage")
    e = episode(REPLY, calls=(new_skill, new_price), skills=("price-x",))
    assert episode_reading(e, r) == EpisodeReading(calls=2, valid_calls=2, skill=1, chain=1, fetched=1, relayed=1,
                                                   abstained=0)


def test_skill_ids_are_read_as_the_executor_reads_them():
    assert valid_name(call("load", {}), H) is False                                  # no skill id
    assert valid_name(call("load", {"name": "chima"}), H) is True                    # a valid id, not the task's
    blocked = call("load", {"name": "jiage-skill"}, status="error", canonical={})     # blocked by a hook: canonical {}
    assert valid_name(blocked, H) is True
    assert valid_name(call("", status="unknown_tool"), H) is False                   # a nameless call
    assert valid_name(call("tianqi", {"city": "北京"}), H) is True                    # a distractor exists: valid


def test_chain_needs_every_gold_call_in_group_order():
    t = task(gold_calls=((("search_products", {"query": "碎花连衣裙"}),), (("get_price", {"product_id": "P1"}),)))
    search = call("sousuo", {"query": "连衣裙"}, result={"items": [{"product_id": "P1"}]})
    in_order = episode(REPLY, calls=(SKILL, search, PRICE), t=t)
    assert episode_reading(in_order, H) == EpisodeReading(calls=3, valid_calls=3, skill=1, chain=1, fetched=1,
                                                          relayed=1, abstained=0)
    reversed_ = episode(REPLY, calls=(SKILL, PRICE, search), t=t)
    assert rules.tc(reversed_).value == 1 and rules.tco(reversed_, H).value == 0  # TC ignores the order
    assert episode_reading(reversed_, H).chain == 0
    assert episode_reading(episode(REPLY, calls=(SKILL, PRICE), t=t), H).chain == 0  # the search is missing
    bad_args = call("jiage", {"product_id": "P1"}, status="invalid_arguments")
    assert episode_reading(episode(REPLY, calls=(SKILL, search, bad_args), t=t), H).chain == 0


def test_abstaining_episode_and_tasks_without_a_chain_or_a_skill():
    silent = episode("您好，欢迎继续在直播间提问", calls=(), skills=())
    # Accurate because it states nothing: the Accuracy of an abstention
    assert episode_reading(silent, H) == EpisodeReading(calls=0, valid_calls=0, skill=0, chain=0, fetched=0,
                                                        relayed=None, abstained=1)
    identity = task(intent="identity", skill_key="identity_compliance", product_ids=(), gold_calls=(), gold_facts={},
                    behaviour="disclose_ai")
    r = episode_reading(episode("我是AI主播", calls=(), t=identity, skills=()), H)
    assert (r.chain, r.fetched, r.relayed, r.abstained) == (None, None, None, None)  # no fact to fetch or state
    no_skill = task(skill_key="")
    assert episode_reading(episode(REPLY, t=no_skill), H).skill is None


def test_fetched_relayed_abstained():
    # The tool returned the price and the reply refuses: the answer reached the context and was not relayed, and
    # the refusal is accurate (it states no fact), so it is an abstention.
    refusal = episode("这个问题我无法回答哦，欢迎继续在直播间提问")
    assert rules.accuracy(refusal).value == 1 and rules.rc(refusal).value == 0
    r = episode_reading(refusal, H)
    assert (r.fetched, r.relayed, r.abstained) == (1, 0, 1)
    # A wrong price is no abstention: Accuracy 0 (the price cue carries 99, the gold fact is 199)
    wrong = episode("这条裙子直播间到手价99元哦")
    assert rules.accuracy(wrong).value == 0
    assert (episode_reading(wrong, H).relayed, episode_reading(wrong, H).abstained) == (0, 0)
    # A cut episode claims nothing but has no valid reply: Accuracy 0, so not an abstention
    cut = episode("", outcome="malformed")
    assert (episode_reading(cut, H).fetched, episode_reading(cut, H).relayed, episode_reading(cut, H).abstained) == (
        1, 0, 0)
    # Returned by a distractor tool only: not fetched (distractor results answer nothing)
    distractor = call("tianqi", {"city": "北京"}, result={"live_price": 199.0})
    assert episode_reading(episode(REPLY, calls=(SKILL, distractor)), H).fetched == 0
    # Two facts, one returned and stated: relayed; the reply states a fact, so no abstention
    two = task(gold_facts={"live_price": 199.0, "stock": 12})
    r = episode_reading(episode(REPLY, t=two), H)
    assert (r.fetched, r.relayed, r.abstained) == (1, 1, 0)


def test_suite_scores_pool_calls_and_leave_out_empty_denominators():
    readings = [EpisodeReading(2, 2, 1, 1, 1, 1, 0), EpisodeReading(2, 0, 0, 0, 1, 0, 1),
                EpisodeReading(0, 0, 0, None, 0, None, 1), EpisodeReading(1, 1, None, None, None, None, None)]
    # name_valid 3 of 5 calls; skill_acc 1 of the 3 episodes needing a skill; chain_done 1 of the 2 with a chain;
    # fact_fetched 2 of the 3 with a fact; relayed 1 of the 2 that fetched; abstained 2 of 3; 5 calls in 4 episodes
    assert reading_scores(readings) == pytest.approx(
        {"name_valid": 60.0, "skill_acc": 100 / 3, "chain_done": 50.0, "fact_fetched": 200 / 3, "relayed": 50.0,
         "abstained": 200 / 3, "calls_per_ep": 1.25})
    assert list(reading_scores(readings)) == ["name_valid", "skill_acc", "chain_done", "fact_fetched", "relayed",
                                              "abstained", "calls_per_ep"]
    # An abstaining suite: validity undefined (no calls), not 0 or 100; nothing fetched, so relayed undefined
    assert reading_scores([EpisodeReading(0, 0, 0, 0, 0, None, 1)] * 3) == {
        "name_valid": None, "skill_acc": 0.0, "chain_done": 0.0, "fact_fetched": 0.0, "relayed": None,
        "abstained": 100.0, "calls_per_ep": 0.0}
    assert reading_scores([EpisodeReading(1, 1, None, None, None, None, None)]) == {
        "name_valid": 100.0, "skill_acc": None, "chain_done": None, "fact_fetched": None, "relayed": None,
        "abstained": None, "calls_per_ep": 1.0}
    with pytest.raises(ValueError, match="no episodes"):
        reading_scores([])
