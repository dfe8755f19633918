"""Placement's query-string grammar for `GET /resource_providers`:
`resources=RC:N,...`, `required=T1,!T2` / `in:T1,T2` (1.22 forbidden, 1.39
any-of and repeats), `member_of=UUID` / `in:A,B` / `!UUID` / `!in:A,B` (1.24
repeats, 1.32 forbidden), with Placement 16.0's messages (placement/util.py)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from hvfleet.placement.errors import PlacementBadRequest


def parse_resources(qs: str) -> dict[str, int]:
    if qs.strip() == "":
        raise PlacementBadRequest(
            "Badly formed resources parameter. Expected resources query string parameter in form: "
            "?resources=VCPU:2,MEMORY_MB:1024. Got: empty string.")
    out: dict[str, int] = {}
    for rt in qs.split(","):
        parts = rt.split(":")
        if len(parts) != 2:
            raise PlacementBadRequest(
                "Badly formed resources parameter. Expected resources query string parameter in "
                f"form: ?resources=VCPU:2,MEMORY_MB:1024. Got: {rt}.")
        rc, raw = parts
        try:
            amount = int(raw)
        except ValueError:
            raise PlacementBadRequest(
                f"Requested resource {rc} expected positive integer amount. Got: {raw}.") from None
        if amount < 1:
            raise PlacementBadRequest(f"Requested resource {rc} requires amount >= 1. Got: {amount}.")
        out[rc] = amount
    return out


@dataclass(frozen=True)
class Traits:
    """Each set of `required` is any-of; the sets are all required."""

    required: tuple[frozenset[str], ...]
    forbidden: frozenset[str]


def _one_traits(val: str, allow_forbidden: bool, allow_any: bool) -> tuple[list[frozenset[str]], set[str]]:
    if val.startswith("in:"):
        if not allow_any:
            raise PlacementBadRequest(
                "Invalid query string parameters: The format 'in:HW_CPU_X86_VMX,CUSTOM_MAGIC' only "
                f"supported since microversion 1.39. Got: {val}")
        any_traits = {s.strip() for s in val[3:].split(",")}
        if not all(any_traits):
            raise PlacementBadRequest(
                "Invalid query string parameters: Expected 'required' parameter value of the form: "
                f"in:HW_CPU_X86_VMX,CUSTOM_MAGIC. Got an empty trait in: {val}")
        if any(t.startswith("!") for t in any_traits):
            raise PlacementBadRequest(
                "Invalid query string parameters: The format 'in:HW_CPU_X86_VMX,CUSTOM_MAGIC' does "
                f"not support forbidden traits. Got: {val}")
        return [frozenset(any_traits)], set()
    all_traits = [s.strip() for s in val.split(",")]
    forbidden = {t.lstrip("!") for t in all_traits if t.startswith("!")}
    if not all([*forbidden, *all_traits]):
        form = "HW_CPU_X86_VMX,!CUSTOM_MAGIC" if allow_forbidden else "HW_CPU_X86_VMX,CUSTOM_MAGIC"
        raise PlacementBadRequest(
            "Invalid query string parameters: Expected 'required' parameter value of the form: "
            f"{form}. Got an empty trait in: {val}")
    required = [frozenset({t}) for t in all_traits if not t.startswith("!")]
    if forbidden and not allow_forbidden:
        raise PlacementBadRequest(
            "Invalid query string parameters: Expected 'required' parameter value of the form: "
            f"HW_CPU_X86_VMX,CUSTOM_MAGIC. Got: {val}")
    return required, forbidden


def parse_traits(values: Sequence[str], version: tuple[int, int]) -> Traits:
    allow_forbidden = version >= (1, 22)
    allow_any = version >= (1, 39)
    if not allow_any:
        values = list(values)[-1:]  # before 1.39 only the last one counts
    required: list[frozenset[str]] = []
    forbidden: set[str] = set()
    for value in values:
        r, f = _one_traits(value, allow_forbidden, allow_any)
        required += r
        forbidden |= f
    return Traits(tuple(required), frozenset(forbidden))


@dataclass(frozen=True)
class MemberOf:
    """Each set of `required` is any-of; every aggregate of `forbidden` is refused."""

    required: tuple[frozenset[str], ...]
    forbidden: frozenset[str]


def uuid_like(value: str) -> bool:
    """oslo.utils' is_uuid_like, as Placement checks an aggregate or a tree:
    any spelling uuid.UUID accepts that is the same hex digits (braces,
    urn:uuid:, upper case, no dashes)."""
    try:
        canonical = str(uuid.UUID(value)).replace("-", "")
    except (TypeError, ValueError, AttributeError):
        return False
    plain = value.replace("urn:", "").replace("uuid:", "").strip("{}").replace("-", "").lower()
    return canonical == plain


def split_member_of(value: str) -> tuple[set[str], set[str]]:
    """One `member_of` value (`in:A,B`, `!in:A,B`, `!A` or `A`) as the
    aggregates it requires (any of) and those it forbids, not yet checked."""
    if value.startswith("!in:"):
        return set(), set(value[4:].split(","))
    if value.startswith("!"):
        return set(), {value[1:]}
    if value.startswith("in:"):
        return set(value[3:].split(",")), set()
    return {value}, set()


def _one_member_of(value: str) -> tuple[set[str], set[str]]:
    if "," in value and not (value.startswith("in:") or value.startswith("!in:")):
        raise PlacementBadRequest(
            "Multiple values for 'member_of' must be prefixed with the 'in:' or '!in:' keyword "
            f"using the valid microversion. Got: {value}")
    required, forbidden = split_member_of(value)
    for agg in sorted(required | forbidden):
        if not uuid_like(agg):
            raise PlacementBadRequest(
                "Invalid query string parameters: Expected 'member_of' parameter to contain valid "
                f"UUID(s). Got: {agg}")
    return required, forbidden


def parse_member_of(values: Sequence[str], version: tuple[int, int], suffix: str = "") -> MemberOf:
    if version < (1, 24) and len(values) > 1:
        raise PlacementBadRequest(f"Multiple member_of{suffix} parameters are not supported")
    required: list[frozenset[str]] = []
    forbidden: set[str] = set()
    for value in values:
        r, f = _one_member_of(value)
        if r:
            required.append(frozenset(r))
        if f:
            if version < (1, 32):
                raise PlacementBadRequest(
                    f"Forbidden member_of{suffix} parameters are not supported in the specified "
                    "microversion")
            forbidden |= f
    return MemberOf(tuple(required), frozenset(forbidden))
