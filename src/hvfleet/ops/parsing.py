"""What parsing every operation's request shares: its plain form (the API's
body, the CLI's options and a dashboard form mapped to the same dict) read
into the typed request in one way (`Query`), a pydantic error as the one
InvalidInput an edge shows (`invalid`). Its own module, so an operation that
needs only this (guests, tokens) does not import `fit` and, through it, the
fleet's objects and the scheduler."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

from pydantic import ValidationError

from hvfleet.model.errors import InvalidInput
from hvfleet.model.meta import Model


class Query(Model):
    """Base of an operation's request in its plain form (JSON keys in camelCase)."""

    @classmethod
    def from_plain(cls, doc: Mapping[str, Any]) -> Self:
        """The request from its plain dict: absent (None) entries take their
        defaults; errors as InvalidInput naming the field."""
        try:
            return cls.model_validate({k: v for k, v in doc.items() if v is not None})
        except ValidationError as exc:
            raise invalid(exc) from None


def invalid(exc: ValidationError) -> InvalidInput:
    """A pydantic error of a plain request as InvalidInput naming its first field."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or None
    return InvalidInput(str(first["msg"]).removeprefix("Value error, "), field=where)
