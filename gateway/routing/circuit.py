"""The circuit breaker for one (provider, upstream model): pure, clock passed in.

    closed ──N consecutive failures, or error rate over the window──▶ open
    open ──`open_for` elapsed (doubling on each trip, capped)──▶ half-open
    half-open ──the one probe succeeds──▶ closed      ──it fails──▶ open (longer)

A rate-limited provider is not broken: a 429 puts it in a cooldown for its `Retry-After` instead,
kept per provider (see `gateway.routing.health`).

The half-open probe is a token (`Claim.probe`): only the request that holds it frees it, so a try
that went without a claim (forced, while another request probes) cannot end someone else's probe.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

from providers.contract.spec import CircuitPolicy

WINDOW_SLOTS = 60


class CircuitState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


# The states as module names, read on every request: on Python 3.11 a member read off its enum
# class goes through `EnumType.__getattr__`'s attribute hook, a call of its own each time.
CLOSED, OPEN, HALF_OPEN = CircuitState.CLOSED, CircuitState.OPEN, CircuitState.HALF_OPEN


@dataclass(frozen=True, slots=True)
class Claim:
    """The right to send one request; `probe` is its token when it is the half-open circuit's
    one probe (0: an ordinary request, nothing to free)."""

    probe: int = 0


FREE = Claim()


@dataclass(slots=True)
class Breaker:
    """One breaker; every method takes `now` so tests drive the clock."""

    policy: CircuitPolicy
    state: CircuitState = CircuitState.CLOSED
    consecutive_failures: int = 0
    trips: int = 0
    open_until: float = 0.0
    probe: int = 0  # the token of the probe out, 0 when none
    _issued: int = field(default=0, repr=False)
    # [slot, requests, failures] per 1/WINDOW_SLOTS of the window: bounded memory whatever the
    # rate (one entry per outcome held 360,000 tuples at 6,000 req/s, and full GC passes
    # walked them all).
    _window: deque[list[int]] = field(default_factory=deque, repr=False)

    def blocked_until(self, now: float) -> float:
        """0 if a request may go now, else when it may."""
        if self.state is OPEN:
            return self.open_until if now < self.open_until else 0.0
        if self.state is HALF_OPEN and self.probing:
            return now + self.policy.open_for
        return 0.0

    @property
    def probing(self) -> bool:
        """A half-open probe is out."""
        return self.probe != 0

    def acquire(self, now: float) -> Claim | None:
        """Claim the right to send one request (None: refused); in half-open only one probe
        at a time, its claim carrying the token that frees it."""
        if self.state is OPEN:
            if now < self.open_until:
                return None
            self.state = HALF_OPEN
        if self.state is HALF_OPEN:
            if self.probe:
                return None
            self._issued += 1
            self.probe = self._issued
            return Claim(self.probe)
        return FREE

    def release(self, claim: Claim) -> None:
        """The claimed request ended without a verdict (the client left, a 429): its probe is
        freed, and only its own (a later probe has another token)."""
        if claim.probe and claim.probe == self.probe:
            self.probe = 0

    def success(self, now: float) -> None:
        self._record(now, ok=True)
        self.consecutive_failures = 0
        if self.state is not CLOSED:
            self.state, self.trips, self.probe = CLOSED, 0, 0

    def failure(self, now: float) -> bool:
        """Count a failure; True if it opened the circuit."""
        self._record(now, ok=False)
        self.consecutive_failures += 1
        if self.state is HALF_OPEN or self._over_threshold():
            self.trip(now)
            return True
        return False

    def trip(self, now: float, until: float | None = None) -> None:
        """Open the circuit; each consecutive trip doubles the time it stays open."""
        self.trips += 1
        period = min(self.policy.max_open_for, self.policy.open_for * 2 ** (self.trips - 1))
        self.state = OPEN
        self.open_until = max(until or 0.0, now + period)
        self.probe = 0

    def _record(self, now: float, ok: bool) -> None:
        width = self.policy.window / WINDOW_SLOTS
        slot = int(now // width) if width > 0 else 0
        window = self._window
        if not window or window[-1][0] != slot:
            oldest = int((now - self.policy.window) // width) if width > 0 else slot
            while window and window[0][0] < oldest:
                window.popleft()
            window.append([slot, 0, 0])
        counts = window[-1]
        counts[1] += 1
        if not ok:
            counts[2] += 1

    def _over_threshold(self) -> bool:
        if self.consecutive_failures >= self.policy.failures:
            return True
        total = sum(counts[1] for counts in self._window)
        if total < self.policy.min_requests:
            return False
        failed = sum(counts[2] for counts in self._window)
        return failed / total >= self.policy.error_rate
