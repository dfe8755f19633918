"""docs/security.md shows the Placement role table the server enforces."""

from __future__ import annotations

from pathlib import Path

from hvfleet.server.placement.policy import rules_markdown


def test_security_doc_has_the_placement_role_table_as_enforced() -> None:
    docs = (Path(__file__).parents[2] / "docs" / "security.md").read_text()
    assert rules_markdown() in docs
