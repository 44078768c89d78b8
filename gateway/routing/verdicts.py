"""A streamed try's verdict, given when its stream ends rather than at its first token.

A stream that opened and then broke (a reset, an idle timeout, an in-band error event, a body
that ended before it finished) failed as much as one that never opened, so its circuit hears it:
a provider that keeps breaking mid-answer opens its circuit like one that keeps refusing
connections. Judged at its first token, each such try would count as a success that resets the
count of consecutive failures, and the circuit would never open. So a stream's try is judged
once, at its end: finished, a success; broken, a failure; let go of before its end (the client
left, a hedge that lost, an answer held while a fallback is tried), no verdict, and the probe
its claim holds, if any, is freed.
"""

from __future__ import annotations

from gateway.routing.circuit import Claim
from gateway.routing.health import Planned, ProviderHealth
from providers.contract.errors import BadUpstreamResponse, ProviderError, ProviderUnavailable
from providers.contract.provider import Resumes
from providers.contract.spec import CircuitPolicy
from providers.contract.stream import UNREADABLE_ANSWER, Opened, close_quietly


def judged(opened: Opened, health: ProviderHealth, planned: Planned, policy: CircuitPolicy,
           claim: Claim | None, resumes: Resumes) -> Opened:
    """`opened`, its rest read through a judge that gives the try's verdict at the end
    (`resumes`: the request's, so a stream continued by another candidate is known broken)."""
    opened.rest = _Judged(opened, health, planned, policy, claim, resumes)
    return opened


class _Judged:
    """An opened stream's rest, passed through as it comes; its verdict given once."""

    def __init__(self, opened: Opened, health: ProviderHealth, planned: Planned,
                 policy: CircuitPolicy, claim: Claim | None, resumes: Resumes) -> None:
        # Not the `Opened` itself: it holds this as its rest, and a cycle per stream would wait
        # for the collector (tests/test_stream_faults.py counts them).
        self._watch = opened.watch
        self._flowing = opened.media_type is not None
        self._resumes = resumes
        self._spliced = resumes.ok  # continuations spliced in before this stream opened
        self._rest = opened.rest
        self._health = health
        self._planned = planned
        self._policy = policy
        self._claim = claim
        self._judged = False

    def __aiter__(self) -> _Judged:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await anext(self._rest)
        except StopAsyncIteration:
            self._judge(ended=True)
            raise
        except ProviderError as exc:
            self._failed(exc)
            raise
        except UNREADABLE_ANSWER as exc:  # a kind could not translate what came: upstream's
            self._failed(BadUpstreamResponse(f"answer could not be read ({type(exc).__name__})"))
            raise

    async def aclose(self) -> None:
        """Let go of the stream: judged by what its consumer read of it."""
        self._judge(ended=False)
        await close_quietly(self._rest)

    def _judge(self, ended: bool) -> None:
        """The consumer has read every chunk it was given into the watch (it feeds a chunk
        before it asks for the next), so the watch tells how the stream went."""
        if self._judged:
            return
        watch = self._watch
        if watch.error_event is not None or watch.malformed or watch.garbage:
            self._failed(ProviderUnavailable("stream carried an error or a malformed event"))
        elif self._resumes.ok > self._spliced:  # it broke; another candidate finished it
            self._failed(ProviderUnavailable("stream broke mid-answer and was resumed"))
        elif watch.done or watch.finished or (ended and self._flowing):
            self._judged = True
            self._health.succeeded(self._planned, self._policy)
        elif ended:
            self._failed(ProviderUnavailable("stream ended before it finished"))
        else:
            self._released()

    def _failed(self, error: ProviderError) -> None:
        if self._judged:
            return
        if not error.trips_circuit:
            self._released()
            return
        self._judged = True
        self._health.failed(self._planned.route, self._policy, error, self._claim)

    def _released(self) -> None:
        self._judged = True
        if self._claim is not None:
            self._health.released(self._planned.route, self._policy, self._claim)

