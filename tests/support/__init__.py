"""Test and bench tooling that is not part of the product (tests/ and bench/ import it)."""
