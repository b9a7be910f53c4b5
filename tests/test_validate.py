"""The shared checks of outside values (andrea.validate): the declared shape of a JSON value andrea
wrote, and JSON sameness. The numbers' parser is walked flag by flag in tests/test_cli_flags.py."""

from __future__ import annotations

import pytest

from andrea.errors import AndreaError
from andrea.validate import Shape, check_shape, same_json, shape_problem

SHAPE = Shape.record(count=Shape.integer(0, 10), rates_=Shape.items(Shape.real(0, 1), 3),
                     files=Shape.mapping(Shape.fixed(Shape.flag(), Shape.name())), note=Shape.optional(Shape.text(5)))
WHOLE = {"count": 3, "rates": [0.5], "files": {"a": [True, "a.tok"]}, "note": None, "other": [1, {"x": 2}]}


@pytest.mark.parametrize("change, problem", [
    ({"count": True}, "count is not an integer from 0 to 10"),
    ({"count": 11}, "count is not an integer from 0 to 10"),
    ({"count": 10**400}, "count is not an integer from 0 to 10"),
    ({"count": 3.0}, "count is not an integer from 0 to 10"),
    ({"rates": [0.5, float("nan")]}, "rates[1] is not a finite number from 0 to 1"),
    ({"rates": [float("inf")]}, "rates[0] is not a finite number from 0 to 1"),
    ({"rates": [0.1] * 4}, "rates holds 4 values, not at most 3"),
    ({"rates": {"0": 0.1}}, "rates is not a list"),
    ({"files": {"a": [True, "../a.tok"]}}, "files['a'][1] is not a plain file name"),
    ({"files": {"a": [True, ".."]}}, "files['a'][1] is not a plain file name"),
    ({"files": {"a": [True]}}, "files['a'] holds 1 values, not 2"),
    ({"files": {"a": [1, "a.tok"]}}, "files['a'][0] is not true or false"),
    ({"files": []}, "files is not an object"),
    ({"note": "longer than five"}, "note is not a text of at most 5 characters"),
])
def test_a_field_out_of_its_declared_shape_is_named(change, problem):
    assert shape_problem(WHOLE, SHAPE) is None
    assert shape_problem({**WHOLE, **change}, SHAPE) == problem


def test_optional_keys_may_be_absent_others_not_and_unknown_keys_are_ignored():
    assert shape_problem({k: v for k, v in WHOLE.items() if k != "rates"}, SHAPE) is None
    assert shape_problem({k: v for k, v in WHOLE.items() if k != "count"}, SHAPE) == "count is missing"
    assert shape_problem([WHOLE], SHAPE) == "the value is not an object"
    with pytest.raises(AndreaError, match=r"^train.json is not as andrea writes it: count is missing\.$"):
        check_shape({}, SHAPE, "train.json")


def test_json_sameness_tells_true_from_one_and_one_from_one_point_zero():
    assert same_json({"a": [1, "x"], "b": None}, {"b": None, "a": [1, "x"]})
    assert not same_json({"v": True}, {"v": 1}) and not same_json({"v": 1.0}, {"v": 1}) and {"v": True} == {"v": 1}
