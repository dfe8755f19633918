"""Hostile documents for the parsers' and the edges' tests: a YAML alias bomb
and JSON or YAML nested past a depth."""

from __future__ import annotations

from typing import Any


def alias_bomb(levels: int = 10, width: int = 10) -> str:
    """The "billion laughs": `levels` levels of `width` aliases, width**levels leaves."""
    lines = ["a0: &a0 [" + ",".join(["x"] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def nested(depth: int, kind: str = "list") -> Any:
    doc: Any = 1
    for _ in range(depth):
        doc = [doc] if kind == "list" else {"k": doc}
    return doc
