"""Kubernetes field selectors over what every object has: `metadata.name`
(and `metadata.namespace`, always "" for hvfleet's cluster-scoped kinds).

As kube-apiserver reads them (apimachinery's fields.ParseSelector): terms
separated by unescaped commas, empty terms skipped, each `KEY=VALUE`,
`KEY==VALUE` or `KEY!=VALUE` split at its first operator, the value
unescaped (`\\,` `\\=` `\\\\`), and every term must hold (AND). A list,
a watch and a deletecollection read the same selector, so a
`metadata.name!=a,metadata.name!=b` deletecollection keeps both a and b."""

from __future__ import annotations

from dataclasses import dataclass

from hvfleet.model.errors import BadRequest

_OPERATORS = ("!=", "==", "=")
_ESCAPED = {"\\", ",", "="}
_FIELDS = ("metadata.name", "metadata.namespace")


@dataclass(frozen=True)
class FieldSelector:
    # The name every `=` term names (None: no such term): authorization is
    # narrowed to it, as Kubernetes' resourceNames are.
    equal: str | None = None
    unequal: frozenset[str] = frozenset()
    nothing: bool = False  # terms no object meets: two names, another namespace

    def matches(self, name: str) -> bool:
        return (not self.nothing and (self.equal is None or name == self.equal)
                and name not in self.unequal)

    @property
    def everything(self) -> bool:
        return self.equal is None and not self.unequal and not self.nothing


def _terms(text: str) -> list[str]:
    """`text` cut at its unescaped commas (an escape kept for the value)."""
    terms, start, escaped = [], 0, False
    for at, ch in enumerate(text):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == ",":
            terms.append(text[start:at])
            start = at + 1
    terms.append(text[start:])
    return terms


def _split(term: str) -> tuple[str, str, str]:
    """(key, operator, raw value) at the term's first operator."""
    for at in range(len(term)):
        for op in _OPERATORS:
            if term.startswith(op, at):
                return term[:at], op, term[at + len(op):]
    raise BadRequest(f"fieldSelector: invalid selector: {term!r}; can't understand it "
                     "(expected FIELD=VALUE, FIELD==VALUE or FIELD!=VALUE)")


def _unescape(value: str, term: str) -> str:
    out, escaped = [], False
    for ch in value:
        if escaped:
            if ch not in _ESCAPED:
                raise BadRequest(f"fieldSelector: invalid escape sequence \\{ch} in {term!r}")
            out.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch in ",=":  # kube requires these escaped in a value
            raise BadRequest(f"fieldSelector: unescaped {ch!r} in the value of {term!r}")
        else:
            out.append(ch)
    if escaped:
        raise BadRequest(f"fieldSelector: the value of {term!r} ends in an unfinished escape")
    return "".join(out)


def parse_field_selector(text: str | None) -> FieldSelector:
    """The selector `text` names; BadRequest (400, as kube-apiserver) naming
    the term that is not one, or a field other than metadata.name/namespace."""
    equal: str | None = None
    unequal: set[str] = set()
    nothing = False
    for term in _terms(text or ""):
        if not term.strip():
            continue
        key, op, raw = _split(term)
        key = key.strip()
        if key not in _FIELDS:
            raise BadRequest(f'fieldSelector: field label not supported: "{key}" '
                             "(only metadata.name and metadata.namespace)")
        value = _unescape(raw, term)
        if key == "metadata.namespace":
            # Cluster-scoped objects: their namespace is "".
            nothing = nothing or (value != "" if op != "!=" else value == "")
        elif op == "!=":
            unequal.add(value)
        elif equal is None:
            equal = value
        elif value != equal:
            nothing = True
    return FieldSelector(equal, frozenset(unequal), nothing)
