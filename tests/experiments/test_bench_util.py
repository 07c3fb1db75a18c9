"""experiments/benchmarks/bench_util.py: `interleaved_step_times` compiles (runs untimed) each arm once, then
times the arms in interleaved rounds, threading each arm's state through its steps."""

import sys
from pathlib import Path

import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "experiments" / "benchmarks"))
from bench_util import interleaved_step_times  # noqa: E402


def test_interleaved_step_times_order_and_state():
    calls = []

    def step_for(name):
        def step(state, batch):
            calls.append(name)
            return state + batch, {"loss": jnp.asarray(float(state))}
        return step

    arms = {"a": [step_for("a"), 0, 1], "b": [step_for("b"), 100, 10]}
    times, median = interleaved_step_times(arms, pairs=3)
    assert calls == ["a", "b"] + ["a", "b"] * 3           # one untimed call each, then interleaved rounds
    assert arms["a"][1] == 4 and arms["b"][1] == 140      # 1 + 3 timed steps of each, state threaded through
    assert list(times) == ["a", "b"] and [len(v) for v in times.values()] == [3, 3]
    assert all(t >= 0 for v in times.values() for t in v)
    assert median == {k: sorted(v)[1] for k, v in times.items()}
