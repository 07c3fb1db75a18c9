"""argparse value types shared by the command lines (a bad value is reported by argparse with the option's name)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def int_in(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse `type` accepting integers in [low, high] (no upper bound when high is None).

    Raises (from the returned function): argparse.ArgumentTypeError naming the value and the range.
    """
    expected = f"an integer in [{low}, {high}]" if high is not None else f"an integer >= {low}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
        return value

    return parse


positive_int = int_in(1)


def float_in(low: float, high: float | None = None, *, low_open: bool = False) -> Callable[[str], float]:
    """An argparse `type` accepting finite numbers in [low, high] ((low, high] with low_open; no upper bound when
    high is None). NaN and infinities are refused.

    Raises (from the returned function): argparse.ArgumentTypeError naming the value and the range.
    """
    left = "(" if low_open else "["
    expected = f"a finite number in {left}{low:g}, {high:g}]" if high is not None else (
        f"a finite number {'>' if low_open else '>='} {low:g}")

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        too_low = value < low or (low_open and value == low)
        if not math.isfinite(value) or too_low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return parse
