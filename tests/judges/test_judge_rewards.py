"""CoT length penalty and reward components (hat_jax.judges.rewards)."""

import pytest
from judge_helpers import episode

from hat_jax.judges.rewards import (
    COMPONENTS, RewardConfig, cot_length_penalty, reasoning_token_counts, reward_components, weighted_reward,
)
from hat_jax.judges.rules import Judgement


@pytest.mark.parametrize("n, want", [(0, 0.0), (100, 0.0), (101, -0.01), (150, -0.5), (200, -1.0), (500, -1.0)])
def test_cot_length_penalty_paper_zone(n, want):
    assert cot_length_penalty(n) == pytest.approx(want)


def test_cot_length_penalty_configurable_and_validated():
    assert cot_length_penalty(60, free=50, zero_at=70) == pytest.approx(-0.5)
    with pytest.raises(ValueError, match="n_tokens"):
        cot_length_penalty(-1)
    with pytest.raises(ValueError, match="free < zero_at"):
        cot_length_penalty(10, free=100, zero_at=100)


J = Judgement(accuracy=1, effectiveness=0.5, adr=1, rc=1, rc_fraction=1.0, tc=1, llm=1, tco=1, tool_rationality=0.5,
              skill_selection=0)


def test_reward_components_one_per_objective():
    got = reward_components(J, [150, 50])  # per-turn penalties -0.5 and 0 -> mean -0.25
    assert got == {"accuracy": 1.0, "effectiveness": 0.5, "tool_rationality": 0.5, "skill_selection": 0.0, "cot_length": -0.25}
    assert tuple(got) == COMPONENTS
    assert reward_components(J, [150, 50], RewardConfig(cot_aggregate="min"))["cot_length"] == -0.5
    assert reward_components(J, 250)["cot_length"] == -1.0
    assert reward_components(J, [])["cot_length"] == 0.0


def test_weighted_reward_default_weights():
    comps = reward_components(J, 150)
    # 1*1 + 1*0.5 + 0.5*0.5 + 0.5*0 + 0.5*(-0.5) = 1.5
    assert weighted_reward(comps, RewardConfig().weights) == pytest.approx(1.5)
    with pytest.raises(KeyError, match="cot_length"):
        weighted_reward({"accuracy": 1.0}, {"accuracy": 1.0, "cot_length": 1.0})


def test_reward_config_rejects_bad_fields():
    with pytest.raises(ValueError, match="unknown components \\['speed'\\]"):
        RewardConfig(weights={"speed": 1.0})
    with pytest.raises(ValueError, match="cot_aggregate"):
        RewardConfig(cot_aggregate="sum")
    with pytest.raises(ValueError, match="zero_at"):
        RewardConfig(cot_free=200, cot_zero_at=100)


def test_reasoning_token_counts_per_assistant_turn():
    e = episode("ok")
    e = e.__class__(**{**e.__dict__, "messages": (
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "reasoning_content": "a b c", "tool_calls": []},
        {"role": "tool", "name": "x", "content": "{}"},
        {"role": "assistant", "content": "ok", "reasoning_content": "d"},
    )})
    assert reasoning_token_counts(e, lambda s: len(s.split())) == [3, 1]


def test_silence_earns_no_accuracy_reward_unless_the_fallback_was_due():
    """No reply states no wrong fact (the judge's Accuracy 1), but the RL reward must not pay for silence:
    accuracy reward 0 when every gold call succeeded, 1 when the price tool failed for good (the
    paper's fallback allows no public reply then)."""
    from judge_helpers import PRICE, SKILL, call, harness

    from hat_jax.judges.rules import judge_episode

    silent = judge_episode(episode("", outcome="no_reply"), harness())
    assert silent.accuracy == 1 and silent.silent_without_cause
    assert reward_components(silent, 0)["accuracy"] == 0.0
    failed = call("jiage", {"product_id": "P1"}, status="error", result={"error": {"type": "service_error"}})
    fallback = judge_episode(episode("", calls=(SKILL, failed), outcome="no_reply"), harness())
    assert fallback.accuracy == 1 and not fallback.silent_without_cause
    assert reward_components(fallback, 0)["accuracy"] == 1.0
    assert not judge_episode(episode("到手价199元", calls=(SKILL, PRICE)), harness()).silent_without_cause


def test_accuracy_needs_intent_leaves_a_refusal_of_an_answerable_question_unpaid():
    """The small-scale RL failure: the price was fetched, then the reply refused. The judge's Accuracy is 1 (no
    wrong fact) and Effectiveness 0; by default the reward pays the accuracy, with accuracy_needs_intent it does
    not. A reply on intent, and a conservative reply after a failed gold call, keep their accuracy reward."""
    from judge_helpers import PRICE, SKILL, call, harness

    from hat_jax.judges.rules import judge_episode

    gated = RewardConfig(accuracy_needs_intent=True)
    off_topic = "这个问题我无法回答哦，咱们还是聊聊直播间的商品吧。"  # the oracle's off-topic reply
    refusal = judge_episode(episode(off_topic, calls=(SKILL, PRICE)), harness())
    assert (refusal.accuracy, refusal.effectiveness) == (1, 0.0) and refusal.off_intent_without_cause
    assert not refusal.silent_without_cause
    assert reward_components(refusal, 0)["accuracy"] == 1.0
    assert reward_components(refusal, 0, gated)["accuracy"] == 0.0
    answer = judge_episode(episode("到手价199元", calls=(SKILL, PRICE)), harness())
    assert not answer.off_intent_without_cause and reward_components(answer, 0, gated)["accuracy"] == 1.0
    failed = call("jiage", {"product_id": "P1"}, status="error", result={"error": {"type": "service_error"}})
    fallback = judge_episode(episode("", calls=(SKILL, failed), outcome="no_reply"), harness())
    assert not fallback.off_intent_without_cause and reward_components(fallback, 0, gated)["accuracy"] == 1.0
    with pytest.raises(ValueError, match="accuracy_needs_intent"):
        RewardConfig(accuracy_needs_intent="yes")
