"""Reading YAML and JSON documents from people and the network, with bounds.

Every YAML read of hvfleet (the API's apply bodies, `hvfleet apply -f`)
goes through `load_yaml_all`, and the API's JSON bodies through `load_json`:
- YAML aliases and anchors are refused: ten levels of ten aliases in a
  475-byte body expand to 10^10 nodes (the "billion laughs"), and no
  manifest of the fleet needs them;
- documents nest at most `MAX_DEPTH` levels (the fleet's kinds nest fewer
  than ten): deeper ones would reach Python's recursion limit in the
  parser, in validation or in the encoder.
Anything refused raises `DocumentError` (a ValueError) naming what and,
for YAML, where; each edge words it as its own input error.
"""

from __future__ import annotations

import json
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.nodes import Node

# Nesting levels of objects and lists in one document.
MAX_DEPTH = 100


class DocumentError(ValueError):
    """A document refused before it was read; the message says what and,
    for YAML, where ("malformed YAML (line L, column C): ...")."""


class _BoundedSafeLoader(yaml.SafeLoader):
    """yaml.SafeLoader without aliases and anchors, at most MAX_DEPTH deep;
    the keys a mapping gives twice are noted in `duplicates`."""

    def __init__(self, stream: str | bytes) -> None:
        super().__init__(stream)
        self._depth = 0
        self.duplicates: list[str] = []

    # YAML 1.1 timestamps stay text, as kube-apiserver's YAML reader (and
    # kubectl's) reads them: `when: 2024-01-01` in an annotation is the string
    # "2024-01-01", not a date no field of these kinds takes.
    yaml_implicit_resolvers = {  # noqa: RUF012 (PyYAML reads it from the class)
        first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: set[str] = set()
            for key, _ in node.value:
                if isinstance(key, yaml.ScalarNode):
                    if key.value in seen:
                        self.duplicates.append(str(key.value))
                    seen.add(key.value)
        return super().construct_mapping(node, deep)

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        event: Any = self.peek_event()  # type: ignore[no-untyped-call]
        mark: Any = event.start_mark
        if isinstance(event, yaml.AliasEvent):
            raise ComposerError(None, None, f"found alias *{event.anchor}: aliases are not accepted "
                                "(write the value out)", mark)
        if getattr(event, "anchor", None) is not None:
            raise ComposerError(None, None, f"found anchor &{event.anchor}: anchors and aliases are "
                                "not accepted (write the value out)", mark)
        # Only objects and lists count as a level, as in check_depth.
        step = 1 if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)) else 0
        self._depth += step
        try:
            if self._depth > MAX_DEPTH:
                raise ComposerError(None, None, f"nested more than {MAX_DEPTH} levels deep", mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= step


def _yaml_error(exc: yaml.YAMLError) -> DocumentError:
    mark = getattr(exc, "problem_mark", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return DocumentError(f"malformed YAML{where}: {problem}")


def load_yaml_all(text: str | bytes, duplicates: list[str] | None = None) -> list[Any]:
    """Every document of a YAML stream (JSON is YAML), empty ones left out;
    the keys a mapping gives twice are added to `duplicates` when given (the
    last one counts, as in JSON)."""
    loader = _BoundedSafeLoader(text)
    try:
        docs = []
        while loader.check_data():  # type: ignore[no-untyped-call]
            doc = loader.get_data()
            if doc is not None:
                docs.append(doc)
        if duplicates is not None:
            duplicates += loader.duplicates
        return docs
    except yaml.YAMLError as exc:
        raise _yaml_error(exc) from None
    except RecursionError:
        raise DocumentError(f"malformed YAML: nested more than {MAX_DEPTH} levels deep") from None
    finally:
        loader.dispose()


def load_yaml(text: str | bytes, duplicates: list[str] | None = None) -> Any:
    """The one document of a YAML text (None when empty); `duplicates` as
    for `load_yaml_all`."""
    docs = load_yaml_all(text, duplicates)
    if len(docs) > 1:
        raise DocumentError("malformed YAML: expected one document, found several")
    return docs[0] if docs else None


def check_depth(doc: Any, limit: int = MAX_DEPTH) -> None:
    """DocumentError when objects and lists in `doc` nest more than `limit` deep
    (walked without recursion, so a deep one cannot exhaust the stack)."""
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > limit:
            raise DocumentError(f"nested more than {limit} levels deep")
        stack.extend((child, depth + 1) for child in children)


def load_json(text: str | bytes, duplicates: list[str] | None = None) -> Any:
    """A JSON document, at most MAX_DEPTH deep; the keys an object gives
    twice are added to `duplicates` when given (the last one counts)."""
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in items:
            if k in out and duplicates is not None:
                duplicates.append(k)
            out[k] = v
        return out

    try:
        doc = json.loads(text, object_pairs_hook=pairs) if duplicates is not None else json.loads(text)
    except RecursionError:
        raise DocumentError(f"nested more than {MAX_DEPTH} levels deep") from None
    check_depth(doc)
    return doc


def without_nulls(doc: Any) -> Any:
    """`doc` with every mapping entry whose value is null left out, as
    kube-apiserver reads an object (a nil map is no map; a custom resource's
    nulls are pruned): `labels:` or `spec.selector:` left empty in a
    templated manifest is absent, not "not a valid dictionary". No field of
    hvfleet's kinds means anything by null that its absence does not."""
    if isinstance(doc, dict):
        return {k: without_nulls(v) for k, v in doc.items() if v is not None}
    if isinstance(doc, list):
        return [without_nulls(v) for v in doc]
    return doc
