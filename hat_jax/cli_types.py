"""argparse value types shared by the command lines (a bad value is reported by argparse with the option's name)."""

from __future__ import annotations

import argparse
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
