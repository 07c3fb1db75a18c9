"""argparse value types of the command lines."""

import argparse

import pytest

from hat_jax.cli_types import int_in, positive_int


def test_int_in_accepts_the_range_and_names_bad_values():
    parse = int_in(1, 3)
    assert [parse("1"), parse("3")] == [1, 3]
    with pytest.raises(argparse.ArgumentTypeError, match=r"expected an integer in \[1, 3\], got 4"):
        parse("4")
    with pytest.raises(argparse.ArgumentTypeError, match=r"expected an integer in \[1, 3\], got 'x'"):
        parse("x")
    assert positive_int("7") == 7
    with pytest.raises(argparse.ArgumentTypeError, match=r"expected an integer >= 1, got 0"):
        positive_int("0")
