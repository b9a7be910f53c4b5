"""The gate of numbers from the command line (`andrea.validate.flag_number`, read by
`andrea.validate.parse_number`): every numeric flag of every command goes through it, and each
damaged value is one sentence (`andrea: error: argument FLAG: ...`), exit 2, before any work."""

from __future__ import annotations

import argparse

import pytest

from andrea.cli import build_parser, main
from andrea.validate import parse_number

DAMAGED = ["nan", "inf", "-inf", "1e400", "-1e400", "²", "١٢", "9" * 5000, "0x10", "1_000", "", " ", "2^70",
           "1e308", "-1e308", "99999999999999999999999999999999999999999"]


def numeric_flags():
    """(the words that reach the command, the flag, its type) for every flag whose value is a number."""
    out = []

    def walk(parser, path):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, path + [name])
            elif action.option_strings and action.type not in (None, str):
                out.append((path, action.option_strings[0], action.type))
    walk(build_parser(), [])
    return out


FLAGS = numeric_flags()


def test_no_flag_reads_a_number_with_a_bare_int_or_float():
    """A new numeric flag declared with type=int or type=float, past the gate, fails here."""
    assert FLAGS and not [f"{' '.join(p)} {flag}" for p, flag, t in FLAGS if t in (int, float)]
    names = {getattr(t, "__name__", "") for _, _, t in FLAGS}
    assert {"integer", "number"} <= names and names <= {"integer", "number", "_layers", "_byte_count"}, names


@pytest.mark.parametrize("path, flag, kind", FLAGS, ids=[f"{' '.join(p)} {f}" for p, f, _ in FLAGS])
def test_every_numeric_flag_refuses_every_damaged_number_in_one_sentence(path, flag, kind, capsys):
    for bad in DAMAGED:
        try:
            parsed = kind(bad)
        except argparse.ArgumentTypeError:
            parsed = None
        if parsed is not None:  # a value some flag may take (1e308 where the range reaches it): in range, finite
            assert parsed == parsed and abs(parsed) < float("inf")
            continue
        code = main(path + [flag, bad])
        err = capsys.readouterr().err
        assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, (flag, bad)
        assert err.startswith(f"andrea: error: argument {flag}: ") and len(err) < 400, (flag, bad)


def test_parse_number_reads_ascii_digits_within_the_range_and_names_the_range():
    assert parse_number("17", int, 1, 20) == 17 and parse_number(" +3 ", int, 0, 9) == 3
    assert parse_number("2.5e-1", float, 0, 1) == 0.25 and parse_number("1", float, 0, 1, lo_open=True) == 1.0
    for text, kind, lo, hi in (("0", int, 1, 9), ("1.5", int, 0, 9), ("0", float, 0, 1), ("1e400", float, 0, 1e300),
                               ("nan", float, 0, 1), ("²", int, 0, 9), ("9" * 41, int, 0, 10**50)):
        with pytest.raises(ValueError, match="must be (an integer from|a number in)"):
            parse_number(text, kind, lo, hi, lo_open=(kind is float and text == "0"))


def test_the_limits_the_command_line_keeps_without_importing_them_are_the_libraries():
    from andrea import prepare
    from andrea.cli import common, train
    from andrea.config import N_SPECIAL
    from andrea.shards import MAX_VOCAB

    assert common.MAX_SEGMENTS == MAX_VOCAB - N_SPECIAL
    assert (train.MIN_SHARD_TOKENS, train.MAX_SHARD_TOKENS) == (prepare.MIN_SHARD_TOKENS, prepare.MAX_SHARD_TOKENS)
