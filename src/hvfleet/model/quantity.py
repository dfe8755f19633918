"""Kubernetes resource quantities with exact arithmetic.

A Quantity holds its value as a `Fraction`, so `0.1 + 0.2` is exactly `0.3`
and memory sizes never drift. Parsing follows the Kubernetes grammar: a signed
decimal number followed by a binary suffix (Ki Mi Gi Ti Pi Ei), a decimal
suffix (n u m k M G T P E) or an exponent (e3, E-2). The canonical string keeps
the family the value was written in (binary or decimal) and picks the largest
suffix that represents it exactly, like `resource.Quantity.String()`.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any, Literal

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

from hvfleet.model.errors import InvalidInput

BINARY_SUFFIXES: dict[str, int] = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}
DECIMAL_SUFFIXES: dict[str, Fraction] = {
    "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 10**3), "": Fraction(1),
    "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9),
    "T": Fraction(10**12), "P": Fraction(10**15), "E": Fraction(10**18),
}

_NUMBER = r"(?P<sign>[+-]?)(?P<int>[0-9]*)(?:\.(?P<frac>[0-9]*))?"
_QUANTITY_RE = re.compile(
    _NUMBER + r"(?:(?P<bin>Ki|Mi|Gi|Ti|Pi|Ei)|(?P<exp>[eE][+-]?[0-9]+)|(?P<dec>[numkMGTPE]?))\Z"
)
# Quantities beyond this are refused: no hypervisor resource is near it, and it
# keeps hostile input ("1e999999999") from costing unbounded time or memory.
_MAX_EXPONENT = 30
_MAX_LENGTH = 64

Format = Literal["binary", "decimal"]


def text_schema(parse: Callable[[Any], Any], input_schema: core_schema.CoreSchema) -> core_schema.CoreSchema:
    """The pydantic schema of a model type written as text (Quantity, ResourceName):
    `parse` validates (its InvalidInput becomes pydantic's error, without the
    field prefix pydantic adds itself), `str` serializes."""

    def validate(v: Any) -> Any:
        try:
            return parse(v)
        except InvalidInput as exc:
            raise ValueError(exc.detail) from None

    return core_schema.no_info_plain_validator_function(
        validate,
        serialization=core_schema.plain_serializer_function_ser_schema(str),
        json_schema_input_schema=input_schema,
    )


class Quantity:
    """An exact, immutable, comparable Kubernetes quantity."""

    __slots__ = ("_format", "_value")

    def __init__(self, value: int | Fraction | Quantity = 0, fmt: Format = "decimal") -> None:
        if isinstance(value, Quantity):
            self._value: Fraction = value._value
            self._format: Format = value._format
            return
        if isinstance(value, bool) or not isinstance(value, (int, Fraction)):
            raise TypeError(f"Quantity needs an int or Fraction, not {type(value).__name__}")
        self._value = Fraction(value)
        self._format = fmt

    @classmethod
    def _of(cls, value: Fraction, fmt: Format) -> Quantity:
        """The Quantity of an arithmetic result, already a Fraction: no checks and
        no copy (half the cost of a sum, which the fleet's totals do 100,000s of)."""
        q = object.__new__(cls)
        q._value = value
        q._format = fmt
        return q

    # -- parsing and formatting -------------------------------------------------

    @classmethod
    def parse(cls, text: str | int | Quantity, *, where: str = "quantity") -> Quantity:
        """Parse `text`; `where` names the field in the error message."""
        if isinstance(text, Quantity):
            return text
        if isinstance(text, bool):
            raise InvalidInput("expected a quantity, got a boolean", field=where)
        if isinstance(text, int):
            return cls(text)
        if not isinstance(text, str):
            raise InvalidInput(f"expected a quantity string, got {type(text).__name__}", field=where)
        parsed = _parse_text(text.strip())
        if isinstance(parsed, str):
            raise InvalidInput(f"{text!r} {parsed}", field=where)
        return parsed

    def __str__(self) -> str:
        return _canonical(self._value, self._format)

    def __repr__(self) -> str:
        return f"Quantity({str(self)!r})"

    # -- values -------------------------------------------------------------------

    @property
    def value(self) -> Fraction:
        return self._value

    @property
    def format(self) -> Format:
        return self._format

    def floor(self) -> int:
        return math.floor(self._value)

    def ceil(self) -> int:
        return math.ceil(self._value)

    def is_integer(self) -> bool:
        return self._value.denominator == 1

    # -- arithmetic (exact) -------------------------------------------------------

    def _coerce(self, other: object) -> Fraction | None:
        if isinstance(other, Quantity):
            return other._value
        if isinstance(other, int) and not isinstance(other, bool):
            return Fraction(other)
        if isinstance(other, Fraction):
            return other
        return None

    def __add__(self, other: Quantity | int) -> Quantity:
        o = self._coerce(other)
        if o is None:
            return NotImplemented
        v = self._value
        if v.denominator == 1 and o.denominator == 1:  # whole numbers: most quantities
            return Quantity._of(Fraction(v.numerator + o.numerator), self._format)
        return Quantity._of(v + o, self._format)

    __radd__ = __add__

    def __sub__(self, other: Quantity | int) -> Quantity:
        o = self._coerce(other)
        if o is None:
            return NotImplemented
        v = self._value
        if v.denominator == 1 and o.denominator == 1:
            return Quantity._of(Fraction(v.numerator - o.numerator), self._format)
        return Quantity._of(v - o, self._format)

    def __rsub__(self, other: Quantity | int) -> Quantity:
        o = self._coerce(other)
        if o is None:
            return NotImplemented
        return Quantity._of(o - self._value, self._format)

    def __mul__(self, other: int | Fraction) -> Quantity:
        if isinstance(other, Quantity):
            return NotImplemented
        o = self._coerce(other)
        if o is None:
            return NotImplemented
        return Quantity._of(self._value * o, self._format)

    __rmul__ = __mul__

    def __neg__(self) -> Quantity:
        return Quantity._of(-self._value, self._format)

    # -- comparisons (by value; the format is presentation only) -----------------------

    def __eq__(self, other: object) -> bool:
        o = self._coerce(other)
        return NotImplemented if o is None else self._value == o

    def __hash__(self) -> int:
        return hash(self._value)

    def __lt__(self, other: Quantity | int) -> bool:
        o = self._coerce(other)
        return NotImplemented if o is None else self._value < o

    def __le__(self, other: Quantity | int) -> bool:
        o = self._coerce(other)
        return NotImplemented if o is None else self._value <= o

    def __gt__(self, other: Quantity | int) -> bool:
        o = self._coerce(other)
        return NotImplemented if o is None else self._value > o

    def __ge__(self, other: Quantity | int) -> bool:
        o = self._coerce(other)
        return NotImplemented if o is None else self._value >= o

    def __bool__(self) -> bool:
        return self._value != 0

    # -- pydantic integration --------------------------------------------------------

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: type[Any], handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return _READABLE.__get_pydantic_core_schema__(source, handler)

    @classmethod
    def __get_pydantic_json_schema__(cls, _schema: Any, _handler: Any) -> dict[str, Any]:
        # The shape Kubernetes uses for resource.Quantity in CRDs.
        return {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": (
                r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
                r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
            ),
            "x-kubernetes-int-or-string": True,
        }


# Every quantity a model holds is a multiple of 1n (Kubernetes' finest scale) and
# at most READABLE_LIMIT in magnitude: its canonical text is then at most 42
# characters, which `Quantity.parse` reads back as the same value. Fields set
# by callers have tighter bounds (hvfleet.model.bounds).
PRECISION = 10**9
READABLE_LIMIT = 10**30


def _preview(v: object) -> str:
    text = str(v)
    return text if len(text) <= 24 else f"{text[:20]}... ({len(text)} characters)"


class QuantityBound:
    """`Annotated[Quantity, QuantityBound(limit)]`: a quantity of magnitude at most
    `limit` and a multiple of 1n, refused past either with a message naming the
    bound (pydantic prefixes the field)."""

    __slots__ = ("_from_text", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = min(limit, READABLE_LIMIT)
        self._from_text = functools.lru_cache(maxsize=8192)(self._parse_bounded)

    def check(self, q: Quantity, shown: str | None = None) -> str | None:
        """Why `q` (written as `shown`) is out of bounds, or None."""
        v = q.value
        if v.denominator != 1 and PRECISION % v.denominator:
            return f"{shown or _preview(q)} is finer than 1n (the smallest quantity is 0.000000001)"
        if abs(v) > self.limit:
            return f"{shown or _preview(q)} is out of range (at most {self.limit} in magnitude)"
        return None

    def _parse_bounded(self, text: str) -> Quantity | str:
        parsed = _parse_text(text.strip())
        if isinstance(parsed, str):
            return f"{_preview(repr(text))} {parsed}"
        return self.check(parsed, _preview(repr(text))) or parsed

    def validate(self, v: Any) -> Quantity:
        if isinstance(v, bool):
            raise ValueError("expected a quantity, got a boolean")
        if isinstance(v, int):
            # Before building anything: a JSON integer can have thousands of digits.
            if not -self.limit <= v <= self.limit:
                raise ValueError(f"{_preview(v)} is out of range (at most {self.limit} in magnitude)")
            return Quantity(v)
        if isinstance(v, float):
            if not math.isfinite(v):
                raise ValueError(f"{v!r} is not a finite quantity")
            v = repr(v)
        if isinstance(v, str):
            out = self._from_text(v)
            if isinstance(out, str):
                raise ValueError(out)
            return out
        if isinstance(v, Quantity):
            why = self.check(v)
            if why is not None:
                raise ValueError(why)
            return v
        raise ValueError(f"expected a quantity string, got {type(v).__name__}")

    def __get_pydantic_core_schema__(
        self, source: type[Any], handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            self.validate,
            serialization=core_schema.plain_serializer_function_ser_schema(str),
            json_schema_input_schema=core_schema.union_schema(
                [core_schema.int_schema(), core_schema.str_schema()]
            ),
        )

    def __get_pydantic_json_schema__(self, schema: Any, handler: Any) -> dict[str, Any]:
        return Quantity.__get_pydantic_json_schema__(schema, handler)


_READABLE = QuantityBound(READABLE_LIMIT)


@functools.lru_cache(maxsize=8192)
def _parse_text(s: str) -> Quantity | str:
    """A Quantity, or why `s` is not one. Cached: the same few strings ("4Gi",
    "2") recur in every stored object, and a Quantity is immutable."""
    if len(s) > _MAX_LENGTH:
        return f"is longer than {_MAX_LENGTH} characters"
    m = _QUANTITY_RE.match(s)
    if not s or m is None or not (m["int"] or m["frac"]):
        return "is not a quantity (examples: 4, 1.5, 500m, 16Gi, 2G, 1e3)"
    digits = (m["int"] or "") + (m["frac"] or "")
    value = Fraction(int(digits or "0"), 10 ** len(m["frac"] or ""))
    fmt: Format = "decimal"
    if m["bin"]:
        value *= BINARY_SUFFIXES[m["bin"]]
        fmt = "binary"
    elif m["exp"]:
        exponent = int(m["exp"][1:])
        if abs(exponent) > _MAX_EXPONENT:
            return "has an exponent out of range"
        value *= Fraction(10) ** exponent
    else:
        value *= DECIMAL_SUFFIXES[m["dec"] or ""]
    if m["sign"] == "-":
        value = -value
    return Quantity(value, fmt)


@functools.lru_cache(maxsize=8192)
def _canonical(v: Fraction, fmt: Format) -> str:
    """The canonical text of a value in a format. Cached: every stored object
    writes the same few amounts ("16Gi", "2") each time it is encoded, and the
    suffix search divides Fractions."""
    if v == 0:
        return "0"
    sign = "-" if v < 0 else ""
    a = abs(v)
    if fmt == "binary" and a.denominator == 1:
        for suffix, mult in reversed(BINARY_SUFFIXES.items()):
            if a.numerator % mult == 0:
                return f"{sign}{a.numerator // mult}{suffix}"
        return f"{sign}{a.numerator}"
    for suffix, dmult in reversed(DECIMAL_SUFFIXES.items()):
        scaled = a / dmult
        if scaled.denominator == 1:
            return f"{sign}{scaled.numerator}{suffix}"
    return sign + _exact_decimal(a)


def _exact_decimal(a: Fraction) -> str:
    """Decimal string of a non-negative fraction whose expansion terminates."""
    for places in range(61):
        scaled = a * 10**places
        if scaled.denominator == 1:
            digits = str(scaled.numerator).rjust(places + 1, "0")
            return digits if places == 0 else f"{digits[:-places]}.{digits[-places:]}"
    # Not a terminating decimal (parsing never produces one); show it rounded.
    return f"{float(a):.12g}"
