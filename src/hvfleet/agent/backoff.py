"""Capped exponential backoff, for reconnecting to libvirt and retrying the store.

Deterministic (no jitter): one agent per host talks to one local libvirtd, so
there is no herd to spread out, and tests can state exact delays.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Backoff:
    initial: float = 0.25
    cap: float = 10.0
    factor: float = 2.0
    attempts: int = 0

    def next_delay(self) -> float:
        """The delay before the next attempt; grows until `cap`."""
        delay = min(self.cap, self.initial * self.factor**self.attempts)
        self.attempts += 1
        return delay

    def reset(self) -> None:
        self.attempts = 0
