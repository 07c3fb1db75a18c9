"""Live-stream suites: AVG and the metrics on hand-computed judgements, and a suite run with a scripted sampler
(each item under its own harness and faults)."""

from __future__ import annotations

import pytest
from eval_helpers import eval_tokenizer
from policy_helpers import recording_envs, scripted_generate

from hat_jax.data.suites import item_env_config, item_harness
from hat_jax.data.world_data import WorldDataConfig, eval_items, world_for
from hat_jax.eval.live import run_live_suite, sample_scores, suite_keys, suite_scores
from hat_jax.judges.rules import Judgement, judge_episode
from hat_jax.model import get_config
from hat_jax.model.sampling import SamplingConfig
from hat_jax.rollout import JaxSampler, RolloutConfig
from hat_jax.rollout.turns import encode
from hat_jax.sim.world_harness import production_harness

REPLY = "ok\n</think>\n\n您好，这款商品我帮您确认一下。"


def _j(**kw) -> Judgement:
    base = dict(accuracy=1, effectiveness=1.0, adr=1, rc=1, rc_fraction=1.0, tc=1, llm=1, tco=1, tool_rationality=1.0,
                skill_selection=1)
    return Judgement(**{**base, **kw})


def test_avg_is_the_per_sample_mean_averaged_over_samples():
    js = [_j(), _j(effectiveness=0.5), _j(accuracy=0, effectiveness=0.0)]
    # per-sample AVG: 1, 0.75, 0 -> 58.33; Accuracy 2/3, Effectiveness 1.5/3
    assert suite_scores("live_qa", js) == pytest.approx({"acc": 200 / 3, "eff": 50.0, "avg": 175 / 3})
    assert suite_scores("variant_qa", js) == suite_scores("live_qa", js)
    assert sample_scores("live_qa", js[1]) == {"acc": 1.0, "eff": 0.5, "avg": 0.75}
    tool = [_j(tc=0), _j(adr=0, rc=0)]  # per sample 2/3 and 1/3
    assert suite_scores("tool_robustness", tool) == pytest.approx({"adr": 50.0, "rc": 50.0, "tc": 50.0, "avg": 50.0})
    prompt = [_j(llm=0, tco=0), _j(), _j(adr=0, llm=0)]  # per sample 1/3, 1, 1/3
    assert suite_scores("prompt_robustness", prompt) == pytest.approx(
        {"adr": 200 / 3, "llm": 100 / 3, "tco": 200 / 3, "avg": 500 / 9})


def test_keys_and_errors():
    assert suite_keys("live_qa") == ("acc", "eff", "avg")
    assert suite_keys("tool_robustness") == ("adr", "rc", "tc", "avg")
    assert suite_keys("prompt_robustness") == ("adr", "llm", "tco", "avg")
    with pytest.raises(ValueError, match=r"unknown 'live'; expected one of \('live_qa'"):
        suite_keys("live")
    with pytest.raises(ValueError, match="no samples"):
        suite_scores("live_qa", [])


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("HAT_JAX_CACHE", str(tmp_path_factory.mktemp("hat-cache")))
    yield
    mp.undo()


@pytest.fixture(scope="module")
def tokenizer(cache, tmp_path_factory):
    return eval_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture
def recorded_envs(monkeypatch):
    return recording_envs(monkeypatch)


def test_suite_items_run_under_their_harness_and_faults(tokenizer, recorded_envs):
    world_config = WorldDataConfig(sft_tasks=8, rl_tasks=0, eval_items=3)
    items = eval_items("tool_robustness", world_config)
    assert [it.perturbation for it in items] == ["tool_failure", "schema_variant", "distractor_tools"]
    world, original = world_for(0, 240), production_harness()
    config = get_config("micro", vocab_size=4096)
    sampler = JaxSampler(None, config, tokenizer, bucket=256,
                         generate_fn=scripted_generate(tokenizer, lambda prompt: REPLY, append_eos=True))
    episodes = RolloutConfig(SamplingConfig(max_new_tokens=64), max_turns=3, seq_len=3000)
    res = run_live_suite(sampler, "tool_robustness", items, episodes, world=world, original=original, batch_size=2)
    assert [c.fault_rates for c in recorded_envs] == [item_env_config(it).fault_rates for it in items]
    assert recorded_envs[0].fault_rates == {"error": 0.25, "timeout": 0.15, "empty": 0.1}
    harnesses = [item_harness(it, original) for it in items]
    assert [r["episode"]["harness_version"] for r in res.records] == [h.version for h in harnesses]
    assert len({h.version for h in harnesses}) == 3
    judgements = [judge_episode(recorded_episode(r), h) for r, h in zip(res.records, harnesses)]
    assert {k: res.scores[k] for k in suite_keys("tool_robustness")} == pytest.approx(
        suite_scores("tool_robustness", judgements))
    assert list(res.scores) == ["adr", "rc", "tc", "avg", "name_valid", "skill_acc", "chain_done", "fact_fetched",
                                "relayed", "abstained", "calls_per_ep"]
    assert all(0 <= res.scores[k] <= 100 for k in ("adr", "rc", "tc", "avg"))
    # The scripted policy replies at once: no call, so validity is undefined and every skill choice is missed.
    assert res.scores["name_valid"] is None and res.scores["calls_per_ep"] == 0.0 and res.scores["skill_acc"] == 0.0
    # ... and its reply, which states nothing, is an accurate abstention
    assert [r["reading"] for r in res.records] == [{"calls": 0, "valid_calls": 0, "skill": 0, "chain": 0,
                                                    "fetched": 0, "relayed": None, "abstained": 1}] * 3
    assert [r["item"]["item_id"] for r in res.records] == [it.item_id for it in items]
    assert all(r["turn_texts"][0] == REPLY + "<|im_end|>" for r in res.records)
    ex = res.extra
    assert ex["episodes"] == 3 and ex["turns"] >= 1 and ex["truncated_pct"] == 0.0
    assert ex["reasoning_tokens"] == len(encode(tokenizer, "ok"))  # `hat_jax.rollout.turns.reasoning_tokens`
    assert ex["wall_s"] > 0 and ex["episodes_per_s"] > 0
    with pytest.raises(ValueError, match="items of another suite"):
        run_live_suite(sampler, "live_qa", items, episodes, world=world, original=original, batch_size=2)
    with pytest.raises(ValueError, match="group_size must be 1"):
        run_live_suite(sampler, "tool_robustness", items, RolloutConfig(SamplingConfig(max_new_tokens=8), group_size=2),
                       world=world, original=original, batch_size=2)


def recorded_episode(record):
    from hat_jax.sim.types import episode_from_dict

    return episode_from_dict(record["episode"])


LOAD_PRICE_SKILL = ("ok\n</think>\n\n<tool_call>\n<function=load_skill>\n<parameter=skill>\nprice-promotion\n"
                    "</parameter>\n</function>\n</tool_call>")


def test_reading_metrics_of_a_policy_that_calls_the_original_names(tokenizer):
    """A policy that always loads the production harness's "price-promotion" with the original loader name, then
    replies: every name is valid under Live QA's original harness and invalid under Variant QA's renamed ones."""
    world_config = WorldDataConfig(sft_tasks=8, rl_tasks=0, eval_items=3)
    world, original = world_for(0, 240), production_harness()
    script = scripted_generate(tokenizer, lambda prompt: REPLY if "<tool_response>" in prompt else LOAD_PRICE_SKILL,
                               append_eos=True)
    sampler = JaxSampler(None, get_config("micro", vocab_size=4096), tokenizer, bucket=256, generate_fn=script)
    episodes = RolloutConfig(SamplingConfig(max_new_tokens=64), max_turns=3, seq_len=3000)
    live = eval_items("live_qa", world_config)
    assert [it.task.skill_key for it in live] == ["price_promotion", "identity_compliance", "product_qa"]
    assert [bool(it.task.gold_calls) for it in live] == [True, False, True]
    res = run_live_suite(sampler, "live_qa", live, episodes, world=world, original=original, batch_size=3)
    # 3 calls, all valid; the right skill for the price task only (1 of 3); no world tool, so no chain (0 of 2)
    assert {k: res.scores[k] for k in ("name_valid", "skill_acc", "chain_done", "calls_per_ep")} == pytest.approx(
        {"name_valid": 100.0, "skill_acc": 100 / 3, "chain_done": 0.0, "calls_per_ep": 1.0})
    # The reply states nothing and no world tool ran: nothing fetched or relayed; both tasks with a checkable fact
    # (the price task, the product question) are accurate abstentions
    assert {k: res.scores[k] for k in ("fact_fetched", "relayed", "abstained")} == {
        "fact_fetched": 0.0, "relayed": None, "abstained": 100.0}
    variant = eval_items("variant_qa", world_config)
    harnesses = [item_harness(it, original) for it in variant]
    assert all(h.tool("load_skill") is None for h in harnesses)  # every held-out family renames the loader
    res = run_live_suite(sampler, "variant_qa", variant, episodes, world=world, original=original, batch_size=3)
    assert [r["episode"]["tool_calls"][0]["status"] for r in res.records] == ["unknown_tool"] * 3
    assert {k: res.scores[k] for k in ("name_valid", "skill_acc", "chain_done", "calls_per_ep")} == {
        "name_valid": 0.0, "skill_acc": 0.0, "chain_done": 0.0, "calls_per_ep": 1.0}
    assert {k: res.scores[k] for k in ("fact_fetched", "relayed", "abstained")} == {
        "fact_fetched": 0.0, "relayed": None, "abstained": 100.0}
