"""A whole answer waited past its provider's total is cut as a total timeout, by one timer for
every answer in flight; a client's own cancellation is never taken for it."""

from __future__ import annotations

import asyncio

import pytest

from providers.wire.expiry import Expiries


async def _wait(expiries: Expiries, seconds: float) -> str:
    expiry = expiries.start()
    try:
        await asyncio.sleep(seconds)
        return "answered"
    except asyncio.CancelledError:
        if not expiry.lapsed():
            raise
        return "total timeout"
    finally:
        expiries.end(expiry)


def test_answers_past_their_total_are_cut_and_those_in_time_are_not() -> None:
    async def main() -> list[str]:
        expiries = Expiries(0.2)
        return list(await asyncio.gather(_wait(expiries, 0.01), _wait(expiries, 5.0),
                                         _wait(expiries, 5.0)))

    assert asyncio.run(main()) == ["answered", "total timeout", "total timeout"]


def test_a_cancel_from_elsewhere_is_not_mistaken_for_the_total() -> None:
    async def main() -> None:
        expiries = Expiries(60.0)
        task = asyncio.create_task(_wait(expiries, 5.0))
        await asyncio.sleep(0)
        task.cancel()  # the client left
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not expiries.timer.waiting, "an ended answer is no longer watched"

    asyncio.run(main())


def test_the_timer_runs_only_while_answers_are_awaited() -> None:
    async def main() -> None:
        expiries = Expiries(0.05)
        assert await _wait(expiries, 0.0) == "answered"
        assert expiries.timer.handle is not None, "the sweep is due once more"
        expiries.timer.sweep()  # that sweep, run now
        assert expiries.timer.handle is None, "it found nothing and did not come back"

    asyncio.run(main())
