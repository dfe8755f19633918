"""The one duration grammar (hvfleet.model.durations): Go/Kubernetes terms plus
days and bare seconds, every caller's union, read back exactly."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hvfleet.model.durations import format_duration, parse_duration, parse_expiry
from hvfleet.model.errors import InvalidInput

CASES = [
    ("1h30m", timedelta(hours=1, minutes=30)),  # the form --resync used to refuse
    ("1.5m", timedelta(seconds=90)),  # the form --ttl used to refuse
    ("90s", timedelta(seconds=90)),
    ("500ms", timedelta(milliseconds=500)),
    ("30d", timedelta(days=30)),
    ("60", timedelta(seconds=60)),  # a bare number is seconds
    ("2.5", timedelta(seconds=2.5)),
    ("0", timedelta(0)),
    (".5h", timedelta(minutes=30)),
    ("1m1h", timedelta(hours=1, minutes=1)),  # terms add up in any order, as in Go
    (" 10m ", timedelta(minutes=10)),
    ("1.0000005s", timedelta(seconds=1)),  # kept to the microsecond, half to even
]


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_parse_duration_reads_every_callers_form(text: str, expected: timedelta) -> None:
    assert parse_duration(text, field="ttl") == expected


@pytest.mark.parametrize("text", ["", "soon", "1x", "-1s", "h", "1h 30m", "1e3s", "never", "1.2.3s",
                                  "10M", "9" * 80 + "s"])
def test_parse_duration_refuses_what_is_not_a_duration_naming_the_field(text: str) -> None:
    with pytest.raises(InvalidInput) as exc:
        parse_duration(text, field="staleness")
    assert exc.value.field == "staleness"
    assert str(exc.value).startswith("staleness: ")
    assert "--" not in str(exc.value)


def test_positive_refuses_zero() -> None:
    with pytest.raises(InvalidInput, match="resync: '0s' must be longer than 0"):
        parse_duration("0s", field="resync", positive=True)
    assert parse_duration("1ms", field="resync", positive=True) == timedelta(milliseconds=1)


def test_overflow_is_invalid_input() -> None:
    with pytest.raises(InvalidInput, match="longer than any date"):
        parse_duration("99999999999d", field="ttl")


@pytest.mark.parametrize(("text", "expected"), [("0", None), ("never", None), ("0s", None),
                                                ("10m", timedelta(minutes=10))])
def test_parse_expiry_reads_zero_and_never_as_no_expiry(text: str, expected: timedelta | None) -> None:
    assert parse_expiry(text, field="ttl") == expected


durations = st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=10**6))


@given(durations)
def test_format_then_parse_is_the_identity(d: timedelta) -> None:
    text = format_duration(d)
    assert parse_duration(text, field="x") == d
    assert len(text) <= 40


@given(st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(["ms", "s", "m", "h", "d"])),
                min_size=1, max_size=6))
def test_terms_add_up(terms: list[tuple[int, str]]) -> None:
    unit = {"ms": timedelta(milliseconds=1), "s": timedelta(seconds=1), "m": timedelta(minutes=1),
            "h": timedelta(hours=1), "d": timedelta(days=1)}
    text = "".join(f"{n}{u}" for n, u in terms)
    assert parse_duration(text, field="x") == sum((n * unit[u] for n, u in terms), timedelta(0))


@given(st.integers(0, 10**9), st.integers(0, 999), st.sampled_from(["s", "m", "h"]))
def test_a_decimal_term_is_its_fraction_of_the_unit(whole: int, milli: int, u: str) -> None:
    per = {"s": 10**6, "m": 60 * 10**6, "h": 3600 * 10**6}[u]
    got = parse_duration(f"{whole}.{milli:03d}{u}", field="x")
    assert got == timedelta(microseconds=whole * per + milli * per // 1000)


@given(st.text(max_size=12))
def test_any_text_parses_or_is_invalid_input(text: str) -> None:
    try:
        d = parse_duration(text, field="x")
    except InvalidInput as exc:
        assert exc.field == "x"
    else:
        assert d >= timedelta(0)
