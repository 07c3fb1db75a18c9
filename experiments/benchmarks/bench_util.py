"""Helpers shared by the benchmark scripts in this folder (run as `python experiments/benchmarks/X.py`, which
puts this folder on sys.path)."""

from __future__ import annotations


def loadavg() -> str:
    """The 1/5/15-minute load averages from /proc/loadavg as one string ("n/a" where there is none): on a
    shared machine, compare timings made under the same load."""
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "n/a"
