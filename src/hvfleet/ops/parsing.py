"""What parsing every operation's request shares: a pydantic error as the one
InvalidInput an edge shows. Its own module, so an operation that needs only
this (guests, tokens) does not import `fit` and, through it, the fleet's
objects and the scheduler."""

from __future__ import annotations

from pydantic import ValidationError

from hvfleet.model.errors import InvalidInput


def invalid(exc: ValidationError) -> InvalidInput:
    """A pydantic error of a plain request as InvalidInput naming its first field."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or None
    return InvalidInput(str(first["msg"]).removeprefix("Value error, "), field=where)
