"""RFC 8785 canonicalization: the spec's examples, number formatting, and agreement
with an independent implementation (the ``rfc8785`` package) on random JSON."""

from __future__ import annotations

import math

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from bus.canonical import canonicalize, format_number


def test_rfc8785_section_3_2_2_example() -> None:
    value = {
        "numbers": [333333333.33333329, 1e30, 4.50, 2e-3, 0.000000000000000000000000001],
        "string": "\u20ac$\u000f\u000aA'\u0042\u0022\u005c\\\"/",
        "literals": [None, True, False],
    }
    expected = (
        '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],'
        '"string":"€$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}'
    )
    assert canonicalize(value).decode() == expected


def test_rfc8785_sorting_by_utf16_code_units() -> None:
    value = {
        "\u20ac": "Euro Sign",
        "\r": "Carriage Return",
        "\ufb33": "Hebrew Letter Dalet With Dagesh",
        "1": "One",
        "\U0001f600": "Emoji: Grinning Face",
        "\u0080": "Control",
        "\u00f6": "Latin Small Letter O With Diaeresis",
    }
    keys = list(__import__("json").loads(canonicalize(value)))
    assert keys == ["\r", "1", "\u0080", "\u00f6", "\u20ac", "\U0001f600", "\ufb33"]


@pytest.mark.parametrize(
    ("number", "text"),
    [
        (0.0, "0"),
        (-0.0, "0"),
        (1.0, "1"),
        (-1.5, "-1.5"),
        (100.0, "100"),
        (1e21, "1e+21"),
        (1e20, "100000000000000000000"),
        (1e-7, "1e-7"),
        (1.5e-6, "0.0000015"),
        (123456789.125, "123456789.125"),
        (5e-324, "5e-324"),
        (1.7976931348623157e308, "1.7976931348623157e+308"),
        (9007199254740991, "9007199254740991"),
        (-42, "-42"),
    ],
)
def test_number_format_matches_ecmascript(number: float, text: str) -> None:
    assert format_number(number) == text


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 2**53, -(2**53), {1: 2}, object()])
def test_refuses_values_without_interoperable_json(bad: object) -> None:
    with pytest.raises((ValueError, TypeError)):
        canonicalize(bad)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=30,
)


@settings(max_examples=400, deadline=None)
@given(json_values)
def test_agrees_with_independent_implementation(value: object) -> None:
    assert canonicalize(value) == rfc8785.dumps(value)
