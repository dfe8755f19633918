from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hvfleet.model import InvalidInput, Quantity

CASES = [
    ("0", 0, "0"),
    ("4", 4, "4"),
    ("1.5", Fraction(3, 2), "1500m"),
    ("500m", Fraction(1, 2), "500m"),
    ("16Gi", 16 * 2**30, "16Gi"),
    ("1024Mi", 2**30, "1Gi"),
    ("1536Mi", 1536 * 2**20, "1536Mi"),
    ("0.5Gi", 2**29, "512Mi"),
    ("2G", 2 * 10**9, "2G"),
    ("1e3", 1000, "1k"),
    ("1E-3", Fraction(1, 1000), "1m"),
    ("-2k", -2000, "-2k"),
    ("+7", 7, "7"),
    (".5", Fraction(1, 2), "500m"),
    ("3.", 3, "3"),
    ("100n", Fraction(1, 10**7), "100n"),
    ("0.0000000001", Fraction(1, 10**10), "0.0000000001"),
    ("12345", 12345, "12345"),
    ("1000Ki", 1000 * 1024, "1000Ki"),
]


@pytest.mark.parametrize(("text", "value", "canonical"), CASES)
def test_parse_and_canonical_form(text: str, value: Fraction | int, canonical: str) -> None:
    q = Quantity.parse(text)
    assert q.value == value
    assert str(q) == canonical
    assert Quantity.parse(str(q)) == q


@pytest.mark.parametrize("bad", ["", "abc", "1.2.3", "Gi", "1Gb", "1 Gi", "--1", "1e", "1e9999", "0x10",
                                 "nan", "inf", "1" * 80])
def test_malformed_quantities_are_refused_with_the_field_named(bad: str) -> None:
    with pytest.raises(InvalidInput, match=r"^spec\.reserved\.memory: "):
        Quantity.parse(bad, where="spec.reserved.memory")


def test_arithmetic_is_exact() -> None:
    assert Quantity.parse("0.1") + Quantity.parse("0.2") == Quantity.parse("0.3")
    assert str(Quantity.parse("1Gi") - Quantity.parse("512Mi")) == "512Mi"
    assert Quantity.parse("3") * 3 == 9
    assert Quantity.parse("1Gi") > Quantity.parse("1G")
    assert Quantity.parse("1000m") == 1
    assert sorted([Quantity.parse("2Ki"), Quantity.parse("1k"), Quantity.parse("3")]) == [3, 1000, 2048]


decimal_suffix = st.sampled_from(["", "n", "u", "m", "k", "M", "G", "T", "P", "E"])
binary_suffix = st.sampled_from(["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"])


@given(
    st.integers(min_value=-(10**12), max_value=10**12),
    st.integers(min_value=0, max_value=6),
    st.one_of(decimal_suffix, binary_suffix),
)
def test_format_then_parse_round_trips(mantissa: int, places: int, suffix: str) -> None:
    text = str(mantissa) if places == 0 else f"{mantissa / 10**places:.{places}f}"
    q = Quantity.parse(text + suffix)
    again = Quantity.parse(str(q))
    assert again == q
    assert str(again) == str(q)  # canonical form is a fixed point


@given(st.integers(min_value=0, max_value=2**62))
def test_binary_canonical_form_uses_the_largest_exact_suffix(n: int) -> None:
    s = str(Quantity(n, "binary"))
    assert Quantity.parse(s).value == n
    for suffix, mult in (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20),
                         ("Ki", 2**10)):
        if n and n % mult == 0:
            assert s.endswith(suffix)
            break


@given(st.lists(st.fractions(max_denominator=1000).filter(lambda f: 1000 % f.denominator == 0),
                max_size=20))
def test_sums_never_drift(values: list[Fraction]) -> None:
    total = sum((Quantity(v) for v in values), Quantity(0))
    assert total.value == sum(values, Fraction(0))
