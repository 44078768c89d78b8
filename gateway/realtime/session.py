"""A Realtime session from its handshake to its end: the door every `/v1/realtime` goes through.

What the edge hands over is framework-free: the handshake's headers, query and offered
subprotocols (`Opening`), and the client's socket (`relay.ClientSocket`). Before any upstream
is dialled, the key is checked by the door every route uses (`auth.admitted`; a browser, which
cannot set headers on a WebSocket, presents it as the subprotocol
`openai-insecure-api-key.<key>`, as OpenAI's API takes it), then its per-minute limits, its
concurrent sessions (`limits.SessionCounts`), the model (an alias with a Realtime candidate, one the
key may use) and its budgets (`charges.admit`). The candidates are then dialled in order
(`connect.dial`), and only then is the client's socket accepted: the `realtime` subprotocol
when offered, and `x-llms-provider` and `x-request-id` on the accept (on the 101 answer under a
server that honours an accept's headers; granian drops them, docs/realtime.md "Known limits",
so a client sends its own `x-request-id` to find the session). A session refused is accepted
to tell it why: an `error` event in the API's shape, then a close (1008 for the caller's
fault, 1013 when full or limited, 1011 when no provider answered).

A session is one record (`core/record.py`), ended once, however it ends: every listener hears
it (metrics, the log line, spend, the key's tokens), with its duration, frames, bytes,
responses, tokens and cost; with tracing on it is one span with an event per response
(`traced`). Neither holds audio, nor any text a client or model said.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gateway.accounts import auth
from gateway.accounts.account import Account
from gateway.accounts.stage import rate_limited
from gateway.core.errors import BudgetExceeded, KeyRateLimited, ModelNotFound
from gateway.core.record import Outcome, Record, request_id
from gateway.core.settings import GatewayKey, Route
from gateway.realtime import charges, connect, traced
from gateway.realtime.limits import SessionCounts
from gateway.realtime.relay import (
    INTERNAL,
    NORMAL,
    POLICY,
    TRY_LATER,
    ClientGone,
    ClientSocket,
    Counts,
    Ending,
    Relay,
    Watch,
    error_event,
)
from gateway.realtime.usage import Event, Tally, cost, split
from gateway.state.runtime import Live, Runtime
from providers.contract.errors import GatewayError, Overloaded, ProviderError
from providers.contract.usage import Price

ENDPOINT = "realtime"
TOKEN_PROTOCOL = "openai-insecure-api-key."
BETA_PROTOCOL = "openai-beta.realtime-v1"
PROTOCOL = "realtime"


@dataclass(frozen=True, slots=True)
class Opening:
    """What the edge reads of a WebSocket handshake: headers (lower-case names), the `model`
    query parameter, the subprotocols offered."""

    headers: Mapping[str, str]
    model: str | None
    subprotocols: tuple[str, ...] = ()

    def presented(self) -> Mapping[str, str]:
        """The headers, with a subprotocol's key as the `Authorization` a header would carry
        (a header the client sent wins)."""
        if "authorization" in self.headers:
            return self.headers
        for offered in self.subprotocols:
            if offered.startswith(TOKEN_PROTOCOL):
                return {**self.headers,
                        "authorization": f"Bearer {offered.removeprefix(TOKEN_PROTOCOL)}"}
        return self.headers

    @property
    def beta(self) -> bool:
        """The client speaks the beta protocol (`OpenAI-Beta: realtime=v1`), said in a header
        or as a subprotocol: the upstream is told the same."""
        return "realtime=v1" in self.headers.get("openai-beta", "") \
            or BETA_PROTOCOL in self.subprotocols

    @property
    def protocol(self) -> str | None:
        """The subprotocol the handshake answers with, as OpenAI's does."""
        return PROTOCOL if PROTOCOL in self.subprotocols else None


async def serve(client: ClientSocket, opening: Opening, runtime: Runtime,
                sessions: SessionCounts) -> None:
    """Run one session to its end (see the module's docstring)."""
    headers = opening.presented()
    record = Record(request_id(opening.headers), ENDPOINT, runtime.listeners)
    record.stream = True
    with runtime.serving(opening.headers, ENDPOINT):
        live = runtime.live
        held: str | None = None
        try:
            key = await auth.admitted(headers, live.snapshot, runtime.accounts)
            held = sessions.enter(_admit(key, record, runtime), live.snapshot.realtime)
            routes = await _model(opening, key, record, runtime, live)
            route, upstream = await connect.dial(runtime, live, routes, record, opening.beta)
        except GatewayError as error:
            if held is not None:
                sessions.leave(held)
            await _refuse(client, opening, record, error, live)
            return
        price = charges.price_known(runtime.price_of(route.provider, record.alias or ""),
                                    live.snapshot.unpriced)
        tally = Tally()
        relay = Relay(client, upstream, live.snapshot.realtime,
                      _watch(runtime, key, price, tally, record), live.redactor)
        ending = Ending(NORMAL, "", Outcome.CLIENT_LEFT)
        try:
            await client.accept(opening.protocol, record.headers())
            record.first_token()
            ending = await relay.run()
        except ClientGone:
            pass  # gone before it was accepted
        finally:
            sessions.leave(held)
            await upstream.close()
            _end(record, ending, tally, relay.counts)


def _admit(key: GatewayKey | Account | None, record: Record, runtime: Runtime) -> str | None:
    """The key's checks of the keys stage: expiry and parallel slots, per-minute limits."""
    if key is None:
        return None
    record.key_id = key.limits.key_id
    account = key if isinstance(key, Account) else None
    if account is not None and runtime.accounts is not None:
        runtime.accounts.check(account, record)
    team = account.team_limits if account is not None else None
    if (left := runtime.limiter.admit(key.limits, team)) is not None:
        rate_limited(record, left)
    return record.key_id


async def _model(opening: Opening, key: GatewayKey | Account | None, record: Record,
                 runtime: Runtime, live: Live) -> list[Route]:
    """The alias's Realtime candidates; 404 when there is none, 403 for a key that may not use
    it, 429 for a budget with nothing left."""
    asked = opening.model or ""
    record.model = asked
    alias = live.snapshot.resolve(asked) if asked else ""
    routes = connect.candidates(live, alias)
    record.known_model = bool(routes)
    record.alias = alias if routes else None
    accounts = runtime.accounts
    if isinstance(key, Account) and accounts is not None:
        accounts.check_model(key, alias if routes else None, asked)
    if not routes:
        raise ModelNotFound(asked)
    priced = all(runtime.price_of(r.provider, alias) is not None for r in routes) \
        or live.snapshot.unpriced is not None
    await charges.admit(accounts, key, priced)
    return routes


def _watch(runtime: Runtime, key: object, price: Price | None, tally: Tally,
           record: Record) -> Watch:
    """Each `response.done` priced, added up and charged; a budget spent ends the session."""
    tracing = runtime.tracing is not None

    async def watch(event: Event) -> Ending | None:
        response = event.response
        usage = response.usage if response is not None else None
        if usage is None:
            return None
        tokens = split(usage)
        dollars = cost(tokens, price) if price is not None else None
        tally.add(tokens, dollars)
        if tracing:
            traced.response(response, tokens, dollars)
        if dollars and await charges.charge(runtime.accounts, key, dollars):
            record.error_code = BudgetExceeded.code
            return Ending(POLICY, "budget exceeded", Outcome.ERROR, BudgetExceeded(
                "The key's budget is spent: the session is ended", None))
        return None

    return watch


async def _refuse(client: ClientSocket, opening: Opening, record: Record, error: GatewayError,
                  live: Live) -> None:
    """Accept only to say why the session is refused, then close; the record ends so."""
    record.status, record.error_code = error.status, error.code
    code = INTERNAL if isinstance(error, ProviderError) or error.status >= 500 else POLICY
    if isinstance(error, (Overloaded, KeyRateLimited, BudgetExceeded)) or error.status == 429:
        code = TRY_LATER
    try:
        await client.accept(opening.protocol, record.headers())
        await client.send(live.redactor.text(error_event(error)))
        await client.close(code, error.code[:120])
    except Exception:
        pass
    finally:
        record.end(Outcome.ERROR)


def _end(record: Record, ending: Ending, tally: Tally, counts: Counts) -> None:
    """The session's one record ended, with what it relayed and used."""
    if ending.outcome is Outcome.ERROR and record.error_code is None:
        record.error_code = "upstream_closed" if ending.code == INTERNAL else "frame_too_large"
    if ending.error is not None and record.error_code is None:
        record.error_code = ending.error.code
    record.cost = tally.dollars if tally.priced else None
    record.end(ending.outcome, tally.usage(), None, close_code=ending.code,
               frames_in=counts.frames_in, frames_out=counts.frames_out,
               bytes_in=counts.bytes_in, bytes_out=counts.bytes_out,
               responses=tally.responses, audio_input_tokens=tally.audio_in,
               audio_output_tokens=tally.audio_out)
