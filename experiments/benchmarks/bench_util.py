"""Helpers shared by the benchmark scripts in this folder (run as `python experiments/benchmarks/X.py`, which
puts this folder on sys.path)."""

from __future__ import annotations

import time


def loadavg() -> str:
    """The 1/5/15-minute load averages from /proc/loadavg as one string ("n/a" where there is none): on a
    shared machine, compare timings made under the same load."""
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "n/a"


def interleaved_step_times(arms: dict, pairs: int) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Wall-clock seconds of training steps of several arms, timed in interleaved rounds (arm 1, arm 2, ...,
    then again), so that a shared machine's load drifts over every arm alike.

    Args:
        arms: {name: [step, state, batch]} with `step(state, batch) -> (state, metrics)` (a jitted train step).
            Each arm first runs once untimed (its compilation); the list's state is replaced by the latest one.
        pairs: timed rounds (>= 1).
    Returns:
        ({name: [seconds of each timed step]}, {name: median seconds}), in the order of `arms`.
    """
    import jax
    import numpy as np

    for arm in arms.values():
        arm[1], metrics = arm[0](arm[1], arm[2])
        jax.block_until_ready(metrics)
    times = {name: [] for name in arms}
    for _ in range(pairs):
        for name, arm in arms.items():
            t0 = time.perf_counter()
            arm[1], metrics = arm[0](arm[1], arm[2])
            jax.block_until_ready(metrics)
            times[name].append(time.perf_counter() - t0)
    return times, {name: float(np.median(v)) for name, v in times.items()}
