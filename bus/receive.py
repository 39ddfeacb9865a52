"""The receive pipeline, composed once: decode, verify, replay, deadline, handler, reply.

Subscriptions only enqueue; a fixed pool of worker tasks, owned by the
:class:`Receiver` and stopped by it, runs the pipeline. The queue is bounded, so a
burst pushes back into the NATS client's buffer instead of growing without limit.

Every request gets exactly one signed reply: the handler's result, the handler's
error, or the refusal that stopped it. A refused envelope never reaches a handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .context import Context, HandlerError, current_envelope, new_trace
from .envelope import Envelope, ErrorInfo
from .errors import BUS_CODES, EnvelopeRejected, RemoteError, TransportError
from .idempotency import IdempotencyStore, idem_key, seal_outcome, verified_outcome
from .replay import ReplayGuard, replay_key
from .signing import Sealer, Verifier
from .transport.base import Msg, Transport

__all__ = ["Handler", "Receiver", "Route"]

log = logging.getLogger("intentbus.receive")

Handler = Callable[[Any, Context], Awaitable[Any]]
#: Replies stay acceptable this long even when the request's deadline is nearer.
MIN_REPLY_LIFETIME_MS = 5_000
_DEADLINE = ErrorInfo("deadline_exceeded", "deadline passed")
_UNVERIFIED = ErrorInfo("handler_error", "the recorded outcome of this request is not verifiable")


@dataclass(frozen=True, slots=True)
class Route:
    """Where a subscription's messages go.

    Attributes:
        intent: the intent the subject encodes; None for the agent's direct subject,
            which dispatches on the envelope's intent.
        scope: replay scope for events (the queue group, or this agent's id).
        kinds: envelope kinds accepted here.
        fanout: a broadcast subject: envelopes whose ``audience`` leaves this agent
            out are dropped without a reply (they were never meant for it).
    """

    intent: str | None
    scope: str
    kinds: tuple[str, ...] = ("request",)
    fanout: bool = False


class Receiver:
    """Runs the pipeline for every subscription of one bus.

    Args:
        transport, sealer, verifier, replay: the bus's parts.
        handlers: intent -> handler, read at dispatch time.
        make_context: builds the handler's :class:`Context`.
        now_ms: the clock.
        concurrency: worker tasks, i.e. handlers running at once.
    """

    def __init__(
        self,
        *,
        transport: Transport,
        sealer: Sealer,
        verifier: Verifier,
        replay: ReplayGuard | None,
        handlers: Mapping[str, Handler],
        make_context: Callable[[Envelope], Context],
        now_ms: Callable[[], int],
        concurrency: int = 64,
    ) -> None:
        self._transport, self._sealer, self._verifier = transport, sealer, verifier
        #: Set by the bus before its first handler subscribes; None while it serves nothing.
        self.replay = replay
        #: Claims and cached outcomes per idempotency key (set with ``replay``).
        self.idempotency: IdempotencyStore | None = None
        #: Intents whose handlers opted out of idempotency (pure, cheap handlers).
        self._no_idem: set[str] = set()
        self._handlers, self._make_context = handlers, make_context
        self._now_ms = now_ms
        self._skew_ms = verifier.policy.skew_ms
        self._queue: asyncio.Queue[tuple[Route, Msg]] = asyncio.Queue(concurrency * 4)
        self._workers: set[asyncio.Task[None]] = set()
        self._concurrency = concurrency
        self.refused: dict[str, int] = {}

    def set_idempotent(self, intent: str, idempotent: bool) -> None:
        """Whether requests of ``intent`` go through the idempotency store (default yes)."""
        if idempotent:
            self._no_idem.discard(intent)
        else:
            self._no_idem.add(intent)

    def start(self) -> None:
        """Start the worker pool (idempotent)."""
        loop = asyncio.get_running_loop()
        while len(self._workers) < self._concurrency:
            self._workers.add(loop.create_task(self._work(), name="intentbus-worker"))

    def sink(self, route: Route) -> Callable[[Msg], Awaitable[None]]:
        """The subscription callback for ``route``: enqueue, waiting when full."""
        put = self._queue.put

        async def enqueue(msg: Msg) -> None:
            await put((route, msg))

        return enqueue

    async def drain(self, timeout: float) -> None:
        """Let queued and running work finish (up to ``timeout``), then stop the workers."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._queue.join()
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers.clear()

    async def _work(self) -> None:
        queue = self._queue
        while True:
            route, msg = await queue.get()
            try:
                await self.process(route, msg)
            except Exception:  # a bug here must not kill the worker; it is logged loudly
                log.exception("pipeline failed on %s", msg.subject)
            finally:
                queue.task_done()

    async def process(self, route: Route, msg: Msg) -> None:
        """Run one message through the pipeline."""
        now = self._now_ms()
        try:
            env = self._verifier.verify(msg.data, now, route.kinds)
            if route.intent is None and env.recipient is None:
                raise EnvelopeRejected(
                    "not_recipient", "an agent's own subject takes only envelopes addressed to it"
                )
            if route.intent is not None and env.intent != route.intent:
                raise EnvelopeRejected("no_handler", f"{msg.subject} serves {route.intent!r}")
            until = env.expires_at + self._skew_ms
            replay = self.replay
            if replay is not None and not await replay.first_seen(_scope(env, route), until, now):
                raise EnvelopeRejected("replayed", f"message {env.message_id} was seen before")
        except EnvelopeRejected as exc:
            if route.fanout and exc.code == "not_recipient":
                return  # a scatter to others: not ours, and no reply to add to their gather
            self.refused[exc.code] = self.refused.get(exc.code, 0) + 1
            log.info("refused %s on %s: %s", exc.message_id or "?", msg.subject, exc)
            await self._refuse(msg, exc)
            return
        if env.recipient is not None:
            scope = f"a.{env.recipient.agent_id}"
        else:  # a queue group, or this agent for a scatter
            scope = f"a.{route.scope}" if route.fanout else f"q.{route.scope}"
        await self._run(env, msg.reply, scope)

    async def _run(self, env: Envelope, transport_reply: str, scope: str) -> None:
        handler = self._handlers.get(env.intent)
        expects_reply = env.kind == "request"
        if handler is None:
            missing = ErrorInfo("no_handler", f"no handler for intent {env.intent!r}")
            await self._reply(env, transport_reply, None, missing)
            return
        now = self._now_ms()
        if env.expires_at <= now:
            await self._reply(env, transport_reply, None, _DEADLINE)
            return
        idem = self.idempotency if expects_reply and env.intent not in self._no_idem else None
        # once per queue group (or per agent, for a scatter or an addressed request)
        key = idem_key(scope, env.sender.agent_id, env.idempotency_key or env.message_id)
        if idem is not None:
            claim = await idem.claim(key, env.expires_at, now, env.expires_at)
            if not claim.run:  # answered before (or still running elsewhere)
                await self._answer_from_cache(env, transport_reply, key, claim.result, idem.shared)
                return
        result, error = await self._invoke(handler, env)
        if idem is not None:
            await self._record(idem, key, result, error, claim.owner)
        if expects_reply:
            await self._reply(env, transport_reply, result, error)

    async def _answer_from_cache(
        self,
        env: Envelope,
        transport_reply: str,
        key: str,
        stored: dict[str, Any] | None,
        idem_shared: bool,
    ) -> None:
        if stored is None:
            await self._reply(env, transport_reply, None, _DEADLINE)
            return
        if idem_shared and not verified_outcome(key, stored, self._verifier.trust):
            log.warning("ignored an unverifiable cached outcome for %s", key)
            await self._reply(env, transport_reply, None, _UNVERIFIED)
            return
        error = stored.get("error")
        info = ErrorInfo(error["code"], error["message"], error.get("data")) if error else None
        await self._reply(env, transport_reply, stored.get("payload"), info)

    async def _invoke(self, handler: Handler, env: Envelope) -> tuple[Any, ErrorInfo | None]:
        """Run the handler under the request's deadline; map failures to error infos."""
        token = current_envelope.set(env)
        scope = asyncio.timeout((env.expires_at - self._now_ms()) / 1000)
        try:
            async with scope:
                return await handler(env.payload, self._make_context(env)), None
        except HandlerError as exc:
            return None, ErrorInfo(exc.code, exc.message, exc.data)
        except TimeoutError as exc:
            if scope.expired():  # our deadline, not a nested call's own timeout
                return None, _DEADLINE
            return None, _passed_on(exc) if isinstance(exc, RemoteError) else _nested(exc)
        except RemoteError as exc:  # a nested call failed: pass its code on, say where from
            return None, _passed_on(exc)
        except asyncio.CancelledError:
            if _cancelling():
                raise  # the bus is closing: this worker stops
            # the handler awaited something that was cancelled: its failure, not ours
            return None, ErrorInfo("handler_error", "CancelledError inside the handler")
        except Exception as exc:
            log.warning("handler for %s raised %s", env.intent, exc, exc_info=True)
            return None, ErrorInfo("handler_error", f"{type(exc).__name__}: {exc}")
        finally:
            current_envelope.reset(token)

    async def _record(
        self, idem: IdempotencyStore, key: str, result: Any, error: ErrorInfo | None, owner: str
    ) -> None:
        try:
            if error is _DEADLINE:
                await idem.release(key, owner)  # did not complete: a retry may run it
                return
            outcome: dict[str, Any] = {"payload": result, "error": error and error.to_dict()}
            try:
                await idem.finish(key, self._sealed(idem, key, outcome))
            except (TypeError, ValueError):  # a non-JSON result: the reply says so, the cache too
                info = ErrorInfo("handler_error", "handler returned a non-JSON value")
                outcome = {"payload": None, "error": info.to_dict()}
                await idem.finish(key, self._sealed(idem, key, outcome))
        except TransportError as exc:
            log.warning("could not record the outcome of %s: %s", key, exc)

    def _sealed(self, idem: IdempotencyStore, key: str, outcome: dict[str, Any]) -> dict[str, Any]:
        return seal_outcome(key, outcome, self._sealer.key) if idem.shared else outcome

    async def _reply(
        self, req: Envelope, transport_reply: str, result: Any, error: ErrorInfo | None
    ) -> None:
        if req.kind != "request":
            if error is not None:
                log.warning("event %s failed: %s %s", req.message_id, error.code, error.message)
            return
        subject = req.reply_to or transport_reply
        if not subject:
            return
        now = self._now_ms()
        fields: dict[str, Any] = {
            "kind": "reply",
            "intent": req.intent,
            "correlation_id": req.correlation_id,
            "trace": new_trace(req.trace),
            "created_at": now,
            "expires_at": max(req.expires_at, now + MIN_REPLY_LIFETIME_MS),
            "recipient": req.sender,
            "in_reply_to": req.message_id,
        }
        try:
            _, body = self._sealer.seal(payload=result, error=error, **fields)
        except (TypeError, ValueError) as exc:
            info = ErrorInfo("handler_error", f"handler returned a non-JSON value: {exc}")
            _, body = self._sealer.seal(payload=None, error=info, **fields)
        await self._send(subject, body)

    async def _refuse(self, msg: Msg, exc: EnvelopeRejected) -> None:
        """Signed error reply to a refused envelope, sent to the transport reply subject."""
        if not msg.reply:
            return
        now = self._now_ms()
        trace = new_trace(None)
        _, body = self._sealer.seal(
            kind="reply",
            intent="bus.refused",
            payload=None,
            correlation_id=exc.message_id or "unknown",
            trace=trace,
            created_at=now,
            expires_at=now + MIN_REPLY_LIFETIME_MS,
            in_reply_to=exc.message_id or "unknown",
            error=ErrorInfo(exc.code, exc.detail),
        )
        await self._send(msg.reply, body)

    async def _send(self, subject: str, body: bytes) -> None:
        try:
            await self._transport.publish(subject, body)
        except TransportError as exc:
            log.warning("could not send reply to %s: %s", subject, exc)


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _nested(exc: TimeoutError) -> ErrorInfo:
    """A nested call timed out (the handler did not catch it): the upstream failed."""
    return ErrorInfo("upstream_error", f"{type(exc).__name__}: {exc}", {"origin_code": "timeout"})


def _passed_on(exc: RemoteError) -> ErrorInfo:
    """An application code from a nested call travels on; the bus's own codes do not,
    since they describe the nested hop, not the request being answered."""
    code = exc.code if exc.code not in BUS_CODES else "upstream_error"
    return ErrorInfo(code, exc.detail, {"origin": exc.sender, "origin_code": exc.code})


def _scope(env: Envelope, route: Route) -> str:
    """Replay key: an addressed envelope once per recipient, whatever subject it came by;
    others once per queue group (or per agent, for events without a group). Unaddressed
    envelopes only come by intent subjects, so no other path can accept them again."""
    scope = env.recipient.agent_id if env.recipient is not None else route.scope
    return replay_key(scope, env.sender.agent_id, env.message_id)
