"""experiments/benchmarks/spec_decode_bench.py: the command line refuses values the benchmark cannot run (naming
the option), `timed` waits for every call (the untimed compilation run included) before reading the clock and
interleaves the configurations, the table ends with a hint when a figure is nan, and one row runs end to end on
the micro preset."""

import argparse
import sys
from pathlib import Path

import jax
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "experiments" / "benchmarks"))
from spec_decode_bench import bench_batch, parse_args, table_lines, timed  # noqa: E402


def test_defaults_parse():
    args = parse_args([])
    assert (args.k, args.batches, args.prompt_len, args.new_tokens, args.reps, args.groups) == (3, [1, 2, 4, 8], 32,
                                                                                               64, 3, 1)
    assert parse_args(["--k", "1", "--new-tokens", "2", "--batches", "1", "3"]).batches == [1, 3]


@pytest.mark.parametrize("argv, option", [
    (["--k", "0"], "--k"),
    (["--k", "-1"], "--k"),
    (["--batches", "0"], "--batches"),
    (["--batches", "1", "-2"], "--batches"),
    (["--reps", "0"], "--reps"),
    (["--new-tokens", "1"], "--new-tokens"),
    (["--prompt-len", "0"], "--prompt-len"),
    (["--groups", "0"], "--groups"),
    (["--k", "8", "--new-tokens", "8"], "--k"),
    (["--prompts", "live_qa"], "--checkpoint"),
])
def test_bad_values_are_refused_naming_the_option(argv, option, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    assert option in capsys.readouterr().err


class Result:
    """A fake result leaf: records when it is waited for."""

    def __init__(self, log, name):
        self.log, self.name = log, name

    def block_until_ready(self):
        self.log.append(("wait", self.name))
        return self


def test_timed_waits_for_every_call_and_interleaves():
    log = []

    def fn_for(name):
        def fn():
            log.append(("call", name))
            return {"tokens": Result(log, name)}
        return fn

    fastest, outs = timed({"a": fn_for("a"), "b": fn_for("b")}, reps=2)
    # the untimed calls (compilation) first, each waited for before the next call starts; then interleaved rounds
    rounds = [("call", "a"), ("wait", "a"), ("call", "b"), ("wait", "b")]
    assert log == rounds * 3
    assert list(fastest) == ["a", "b"] and all(t >= 0 for t in fastest.values())
    assert outs["a"]["tokens"].name == "a" and outs["b"]["tokens"].name == "b"
    with pytest.raises(ValueError, match="reps"):
        timed({"a": fn_for("a")}, reps=0)


def row(batch, plain, spec):
    return {"batch": batch, "plain_tok_s": plain, "spec_tok_s": spec, "speedup": spec / plain,
            "acceptance": 0.5, "mean_accepted_length": 2.0, "identical": True}


def test_table_hints_at_reps_only_when_a_figure_is_nan():
    clean = table_lines([row(1, 100.0, 80.0), row(2, 150.0, 120.0)], reps=3)
    assert len(clean) == 3 and not any("hint" in line for line in clean)
    noisy = table_lines([row(1, float("nan"), 80.0), row(2, 150.0, 120.0)], reps=3)
    assert len(noisy) == 4
    assert noisy[-1].startswith("hint:") and "--reps" in noisy[-1] and "now 3" in noisy[-1]


def test_one_row_on_the_micro_preset():
    from hat_jax.model import get_config, init_params

    config = get_config("micro")
    params = init_params(config, jax.random.key(0))
    args = argparse.Namespace(groups=1, prompt_len=5, new_tokens=4, k=1, reps=1)
    r = bench_batch(params, config, 2, args)
    assert r["batch"] == 2 and r["identical"] is True
    assert 0.0 <= r["acceptance"] <= 1.0 and 1.0 <= r["mean_accepted_length"] <= 2.0
    assert all(r[name] > 0 for name in ("prefill_s", "plain_s", "spec_s"))
