"""Errors of the scheduling layer."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hvfleet.model.errors import Conflict, HvfleetError

if TYPE_CHECKING:
    from hvfleet.scheduling.fit import Rejection


class DoesNotFit(HvfleetError):
    """A claim or request does not fit on a host (any more). The CLI exits 3:
    a scheduler retries elsewhere, which it would not do for bad input (2)."""

    def __init__(self, host: str, rejections: list[Rejection]) -> None:
        reasons = "; ".join(r.message for r in rejections) or "no reason given"
        super().__init__(f"does not fit on {host}: {reasons}")
        self.host = host
        self.rejections = rejections


class NoHostFits(HvfleetError):
    """`reserve --auto` found no candidate host (or lost every race for one)."""


class ConsumerAlreadyHolds(Conflict):
    """The consumer already holds a reservation on that host: a scheduler must
    not retry elsewhere, or one instance would hold space on two hosts."""

    def __init__(self, consumer: str, reservation: str, host: str) -> None:
        super().__init__(f"consumer {consumer} already holds reservation {reservation} on {host}")
        self.consumer = consumer
        self.reservation = reservation
        self.host = host
