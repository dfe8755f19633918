"""The guest generator's own error class, apart from the decision modules
that raise it and the check that reports it (so neither imports the other)."""

from __future__ import annotations

from hvfleet.model.errors import HvfleetError


class NotEverywhere(HvfleetError):
    """The guest does not run on every host of the group: some host lacks
    what it needs (a firmware, a device model, a machine type, a CPU model),
    so no definition for the whole group exists. Not bad input (the same
    request fits a group whose hosts have it): the CLI exits 3, as for a
    request that does not fit, and the API answers 409 Conflict."""
