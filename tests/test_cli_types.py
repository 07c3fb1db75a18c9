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


def test_float_in_refuses_nan_infinity_and_out_of_range():
    import argparse

    from hat_jax.cli_types import float_in

    parse = float_in(0.0, 2.0)
    assert parse("0") == 0.0 and parse("1.5") == 1.5
    for bad in ("nan", "inf", "-0.1", "2.5", "x"):
        with pytest.raises(argparse.ArgumentTypeError, match=rf"expected a finite number in \[0, 2\], got '{bad}'"):
            parse(bad)
    with pytest.raises(argparse.ArgumentTypeError, match=r"expected a finite number > 0, got '0'"):
        float_in(0.0, low_open=True)("0")


def test_replay_refuses_a_nan_temperature(capsys):
    from hat_jax.deploy import replay

    with pytest.raises(SystemExit) as info:
        replay.main(["--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--temperature", "nan"])
    assert info.value.code == 2
    assert "argument --temperature: expected a finite number in [0, 2], got 'nan'" in capsys.readouterr().err
