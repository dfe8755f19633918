"""Kubernetes label selectors: `a=b,c!=d,e in (x,y),f notin (z),g,!h`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from hvfleet.model.errors import InvalidInput
from hvfleet.model.meta import label_value_error, qualified_name_error

Op = Literal["=", "!=", "in", "notin", "exists", "!exists"]

_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_VALUE = r"[A-Za-z0-9]?(?:[-A-Za-z0-9_.]*[A-Za-z0-9])?"
_TERM_RE = re.compile(
    rf"\s*(?:(?P<nkey>!\s*{_KEY})"
    rf"|(?P<skey>{_KEY})\s+(?P<setop>in|notin)\s*\((?P<values>[^()]*)\)"
    rf"|(?P<ekey>{_KEY})\s*(?P<eqop>==|=|!=)\s*(?P<value>{_VALUE})"
    rf"|(?P<key>{_KEY}))\s*(?:,|\Z)"
)


@dataclass(frozen=True)
class Requirement:
    key: str
    op: Op
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        match self.op:
            case "=":
                return present and value == self.values[0]
            case "!=":
                return not present or value != self.values[0]
            case "in":
                return present and value in self.values
            case "notin":
                return not present or value not in self.values
            case "exists":
                return present
            case "!exists":
                return not present


@dataclass(frozen=True)
class Selector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)

    def __str__(self) -> str:
        parts = []
        for r in self.requirements:
            if r.op in ("=", "!="):
                parts.append(f"{r.key}{r.op}{r.values[0]}")
            elif r.op in ("in", "notin"):
                parts.append(f"{r.key} {r.op} ({','.join(r.values)})")
            else:
                parts.append(r.key if r.op == "exists" else f"!{r.key}")
        return ",".join(parts)


def parse_selector(text: str | None) -> Selector:
    """Parse a label selector; an empty one matches everything."""
    if text is None or not text.strip():
        return Selector()
    reqs: list[Requirement] = []
    pos = 0
    while pos < len(text):
        m = _TERM_RE.match(text, pos)
        if m is None or m.end() == pos:
            raise InvalidInput(
                f"selector: cannot parse {text[pos:]!r} at position {pos} "
                "(expected key=value, key!=value, key in (a,b), key notin (a,b), key or !key)"
            )
        if m.group().rstrip().endswith(",") and not text[m.end():].strip():
            raise InvalidInput(f"selector: {text!r}: nothing after the last ',' "
                               "(expected another requirement)")
        if m["nkey"]:
            reqs.append(Requirement(m["nkey"][1:].strip(), "!exists"))
        elif m["skey"]:
            values = tuple(v.strip() for v in m["values"].split(",") if v.strip())
            if not values:
                raise InvalidInput(f"selector: {m['skey']} {m['setop']} () needs at least one value")
            op: Op = "in" if m["setop"] == "in" else "notin"
            reqs.append(Requirement(m["skey"], op, values))
        elif m["ekey"]:
            eq: Op = "!=" if m["eqop"] == "!=" else "="
            reqs.append(Requirement(m["ekey"], eq, (m["value"],)))
        else:
            reqs.append(Requirement(m["key"], "exists"))
        pos = m.end()
        _check(reqs[-1])
    return Selector(tuple(reqs))


def _check(r: Requirement) -> None:
    """A requirement's key and values as kube-apiserver's selector parser
    takes them (a qualified name; label values), else InvalidInput (400)."""
    why = qualified_name_error(r.key)
    if why is None:
        why = next((e for e in map(label_value_error, r.values) if e is not None), None)
    if why is not None:
        raise InvalidInput(f"selector: {why}")
