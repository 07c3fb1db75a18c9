"""`evaluate` end to end on the micro model (random init, a BPE covering the eval prompts) with tiny sizes:
the full key schema, value ranges, out_dir files, the MTP draft acceptance; `evaluate_checkpoint` on the same
params; config errors.

Shapes are chosen for one sampler compilation: batch_size 2 everywhere, prompt bucket = seq_len (one prompt
width), the same max_new_tokens for the live turns and the instruction-following completions."""

from __future__ import annotations

import dataclasses
import math

import jax
import pytest
from eval_helpers import SHARED_IFEVAL, TINY_WORLD, eval_tokenizer, read_jsonl

from hat_jax.data.suites import SUITES
from hat_jax.eval import EvalConfig, evaluate, evaluate_checkpoint
from hat_jax.eval import ifeval as ifeval_data
from hat_jax.eval.ifeval import IFEVAL_ENV
from hat_jax.model import get_config, init_params
from hat_jax.model.checkpoint_io import save_model_checkpoint

NEW = 8
CONFIG = EvalConfig(world=TINY_WORLD, max_new_tokens=NEW, max_turns=2, seq_len=1536, batch_size=2, bucket=1536,
                    ifeval_data=str(SHARED_IFEVAL), ifeval_limit=3, ifeval_mini_items=3, if_max_new_tokens=NEW,
                    mtp_items=2)
SCHEMA = {"live_qa": {"acc", "eff", "avg"}, "variant_qa": {"acc", "eff", "avg"},
          "tool_robustness": {"adr", "rc", "tc", "avg"}, "prompt_robustness": {"adr", "llm", "tco", "avg"}}
IF_KEYS = {"prompt_strict", "inst_strict", "prompt_loose", "inst_loose"}
# `hat_jax.judges.reading`, after the suite's keys
READING = ("name_valid", "skill_acc", "chain_done", "fact_fetched", "relayed", "abstained", "calls_per_ep")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("HAT_JAX_CACHE", str(tmp_path_factory.mktemp("hat-cache")))
    mp.delenv(IFEVAL_ENV, raising=False)
    if not SHARED_IFEVAL.is_file():  # no local copy: IFEval must then be skipped, not fail
        mp.setattr(ifeval_data, "_load_hub", lambda: (_ for _ in ()).throw(ConnectionError("offline test")))
    yield
    mp.undo()


@pytest.fixture(scope="module")
def model(env, tmp_path_factory):
    tok = eval_tokenizer(tmp_path_factory.mktemp("tok"))
    config = get_config("micro", vocab_size=4096)
    return config, init_params(config, jax.random.key(0)), tok


@pytest.fixture(scope="module")
def config():
    return CONFIG if SHARED_IFEVAL.is_file() else dataclasses.replace(CONFIG, ifeval_data=None)


@pytest.fixture(scope="module")
def results(model, config, tmp_path_factory):
    model_config, params, tok = model
    out = tmp_path_factory.mktemp("eval-out")
    return evaluate(config.sampler(params, model_config, tok), config, out_dir=out, progress=False), out


def _in_range(d):
    return all(isinstance(v, float) and math.isfinite(v) and 0.0 <= v <= 100.0 for v in d.values())


def test_full_schema_and_ranges(results):
    res, _ = results
    assert list(res) == [*SUITES, "ifeval", "ifeval_mini", "mtp", "extra"]
    for suite, keys in SCHEMA.items():
        assert list(res[suite])[len(keys):] == list(READING) and set(res[suite]) == keys | set(READING), suite
        assert _in_range({k: res[suite][k] for k in keys}), (suite, res[suite])
        assert _in_range({k: v for k, v in res[suite].items() if k in READING[:3] and v is not None}), res[suite]
        calls = res[suite]["calls_per_ep"]
        assert calls >= 0 and (res[suite]["name_valid"] is None) == (calls == 0)  # no calls: validity undefined
    assert set(res["ifeval_mini"]) == IF_KEYS and _in_range(res["ifeval_mini"])
    if SHARED_IFEVAL.is_file():
        assert set(res["ifeval"]) == IF_KEYS and _in_range(res["ifeval"])
        assert res["extra"]["ifeval"]["prompts"] == 3 and "EvalConfig.ifeval_data" in res["extra"]["ifeval"]["source"]
    else:
        assert res["ifeval"] is None and "google/IFEval" in res["extra"]["ifeval"]["skipped"]
    ex = res["extra"]
    for suite in SUITES:
        e = ex[suite]
        assert e["episodes"] == 2 and e["turns"] >= 1 and 0 <= e["truncated_pct"] <= 100 and e["wall_s"] > 0
        assert e["tokens_generated"] >= 2 and e["reasoning_tokens"] >= 0
    assert ex["seq_len"] == 1536 and ex["wall_s"] > 0 and ex["ifeval_mini"]["prompts"] == 3
    mtp = res["mtp"]
    assert set(mtp) == {"acceptance_depth1", "mean_accepted_length", "positions", "episodes"}
    assert mtp["episodes"] == 2 and isinstance(mtp["positions"], int) and mtp["positions"] > 0
    assert 0.0 <= mtp["acceptance_depth1"] <= 1.0 and mtp["mean_accepted_length"] == 1.0 + mtp["acceptance_depth1"]
    assert ex["mtp"]["items"] == 2 and ex["mtp"]["max_len"] == 1536 and ex["mtp"]["wall_s"] > 0


def test_mtp_acceptance_is_skipped_with_a_reason(model, config):
    from hat_jax.eval.runner import _mtp_acceptance

    model_config, params, tok = model
    no_mtp = config.sampler(params, model_config.replace(mtp_num_hidden_layers=0), tok)
    assert _mtp_acceptance(no_mtp, config, 1536) == (None, {"skipped": "the model has no MTP block "
                                                                      "(mtp_num_hidden_layers = 0)"})
    sampler = config.sampler(params, model_config, tok)
    off = dataclasses.replace(config, mtp_items=0)
    assert _mtp_acceptance(sampler, off, 1536) == (None, {"skipped": "EvalConfig.mtp_items is 0"})

    class Remote:  # an inference server behind the Sampler protocol: no params to run a forward on
        model_config = sampler.model_config

    figures, extra = _mtp_acceptance(Remote(), config, 1536)
    assert figures is None and "not a JaxSampler" in extra["skipped"]


def test_out_dir_files(results):
    res, out = results
    for suite in SUITES:
        rows = read_jsonl(out / f"{suite}.jsonl")
        assert len(rows) == 2 and {"item", "scores", "judgement", "reading", "truncated", "turn_texts",
                                   "episode"} <= set(rows[0])
        assert sum(r["reading"]["calls"] for r in rows) / 2 == res[suite]["calls_per_ep"]
        assert all(r["reading"]["calls"] == len(r["episode"]["tool_calls"]) for r in rows)
        assert rows[0]["item"]["suite"] == suite
        assert sum(r["scores"]["avg"] for r in rows) / 2 == pytest.approx(res[suite]["avg"])
    mini = read_jsonl(out / "ifeval_mini.jsonl")
    assert len(mini) == 3 and {"key", "prompt", "completion", "response", "strict", "loose"} <= set(mini[0])
    assert all(len(r["completion"]) > 0 and r["completion_tokens"] <= NEW for r in mini)
    assert (out / "ifeval.jsonl").is_file() == SHARED_IFEVAL.is_file()
    assert (out / "scores.json").is_file()


def test_evaluate_checkpoint_reproduces(model, config, results, tmp_path):
    model_config, params, tok = model
    ckpt = save_model_checkpoint(tmp_path / "ckpt", params, model_config)
    tok.save_pretrained(str(ckpt / "tokenizer"))
    small = dataclasses.replace(config, suites=("live_qa",), ifeval=False)
    again = evaluate_checkpoint(ckpt, small, progress=False)
    assert list(again) == ["live_qa", "ifeval", "ifeval_mini", "mtp", "extra"] and again["ifeval"] is None
    assert again["extra"]["ifeval"] == {"skipped": "EvalConfig.ifeval is False"}
    res, _ = results
    assert again["live_qa"] == res["live_qa"] and again["ifeval_mini"] == res["ifeval_mini"]  # greedy: same scores
    assert again["mtp"] == res["mtp"]
    with pytest.raises(FileNotFoundError, match="no tokenizer folder"):
        evaluate_checkpoint(save_model_checkpoint(tmp_path / "bare" / "ckpt", params, model_config), small)


def test_config_errors():
    with pytest.raises(ValueError, match=r"EvalConfig.suites = \('live',\): expected distinct names from"):
        EvalConfig(suites=("live",))
    for bad in (None, "live_qa"):   # --set eval.suites=null; a bare string is not a list of names
        with pytest.raises(ValueError, match=rf"EvalConfig.suites = {bad!r}: expected a list of suite names"):
            EvalConfig(suites=bad)
    assert EvalConfig(suites=[]).suites == ()                    # IFEval and IF-mini only
    with pytest.raises(ValueError, match=r"EvalConfig.ifeval_limit = 0: expected None or an int in \[1, 541\]"):
        EvalConfig(ifeval_limit=0)
    with pytest.raises(ValueError, match="EvalConfig.compute_dtype = 'fp8'; valid"):
        EvalConfig(compute_dtype="fp8")
    with pytest.raises(ValueError, match="EvalConfig.batch_size = 0: expected an int >= 1"):
        EvalConfig(batch_size=0)
    with pytest.raises(ValueError, match=r"EvalConfig.mtp_items = -1: expected an int >= 0"):
        EvalConfig(mtp_items=-1)
    with pytest.raises(ValueError, match=r"EvalConfig.mtp_vocab_chunk = 0: expected None or an int >= 1"):
        EvalConfig(mtp_vocab_chunk=0)
    with pytest.raises(ValueError, match="EvalConfig.world.eval_items = 0"):
        EvalConfig(world=dataclasses.replace(TINY_WORLD, eval_items=0))
    assert EvalConfig(suites=["live_qa"]).suites == ("live_qa",)
