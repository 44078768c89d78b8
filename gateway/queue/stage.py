"""The queue's stages: room before the body is read, the turn once the request is admitted.

`room` takes the call's ticket for a slot under `server.max_concurrency` (given back once,
when the call closes, however it ended) and refuses at once when neither a slot nor a place in
the queue is left, so a flood past the queue costs no body reads. It also meters the body as it
is read against the bytes every request's body may hold at once
(`server.max_body_bytes_held`, `gateway.queue.bodies`): past them, a 503 before the rest is
read; the bytes are given back when the call closes. `turn` comes last before the request is
served: a request that would be refused anyway (its key, its body, its budget) is refused
without waiting.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from gateway.core.call import Call, Delivery, Next, Stage
from gateway.queue.bodies import Holding
from gateway.queue.queueing import Queue, Ticket, Turn, turn_of

TICKET = "queue.ticket"
TURN = "queue.turn"


def room(queue: Queue, queue_timeout: float, enter: Callable[[], None],
         leave: Callable[[Ticket], None]) -> Stage:
    """The stage that takes the call's ticket and checks there is room for it."""

    def stage(call: Call, following: Next) -> Awaitable[Delivery]:
        ticket = queue.ticket()
        enter()
        holding = Holding(queue.bodies, queue.retry_after)

        def close() -> None:  # its body's bytes, then its slot or place, given back
            holding.release()
            leave(ticket)

        call.on_close(close)
        call.meter = holding.take
        turn = turn_of(call.headers, call.key.limits if call.key is not None else None,
                       queue_timeout)
        queue.check_room(turn)
        call.state[TICKET], call.state[TURN] = ticket, turn
        call.priority = turn.priority
        return following(call)

    return stage


def turn(queue: Queue) -> Stage:
    """The stage that waits for the call's slot (a client that leaves leaves the queue)."""

    def stage(call: Call, following: Next) -> Awaitable[Delivery]:
        ticket: Ticket = call.state[TICKET]
        wanted: Turn = call.state[TURN]
        if queue.start_now(ticket, wanted):
            return following(call)
        return _waited(queue, ticket, wanted, call, following)

    return stage


async def _waited(queue: Queue, ticket: Ticket, wanted: Turn, call: Call, following: Next
                  ) -> Delivery:
    """The call served once its turn comes."""
    async with call.watching():
        await queue.wait(ticket, wanted)
    call.record.detail["queued_ms"] = round(ticket.waited * 1000, 2)  # its log line
    return await following(call)
