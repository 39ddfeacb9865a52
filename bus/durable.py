"""Async requests with callbacks, durable on JetStream: accepted work is never lost.

Requester: :func:`send` seals the request (``reply_to``: a bus subject, by default this
agent's results subject, or an HTTP(S) URL), publishes it into the stream
``IB_REQUESTS`` with ``Nats-Msg-Id`` = its message id (so a retried publish after a lost
ack stores it once), and returns as soon as the server acknowledged it. Results wait in
``IB_RESULTS`` until the requester reads them (:class:`Results`), across its restarts.

Executor: :class:`DurableExecutor` pulls from a durable consumer shared by every
instance of the intent. A request is acknowledged only after its outcome is recorded
(idempotency store) and delivered; an executor that dies mid-request leaves it
unacknowledged, and JetStream redelivers it to another instance after ``ack_wait``.
The idempotency claim (leased for ``ack_wait``, renewed while working) makes the
outcome happen once; redeliveries of a finished request re-send the recorded outcome.

Interim states go to ``reply_to`` as replies with status ``working`` or
``pending_review`` (see :class:`bus.context.PendingReview`); parked requests live in the
KV bucket ``intentbus_pending`` until a reviewer decides (:mod:`bus.review`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from .callbacks import CallbackPolicy
from .context import Context, PendingReview, Review, new_trace
from .envelope import Envelope, ErrorInfo
from .errors import EnvelopeRejected, TransportError, UsageError
from .idempotency import IdempotencyStore, idem_key, seal_outcome, verified_outcome
from .ids import new_id
from .receive import Handler
from .signing import VerificationPolicy, Verifier
from .transport.base import JsMsg, KeyValue, PullConsumer

if TYPE_CHECKING:
    from .bus import Bus
    from .callbacks import Deliverer

__all__ = ["DurableConfig", "DurableExecutor", "Results", "ensure_streams", "send"]

log = logging.getLogger("intentbus.durable")
REQUESTS_STREAM, RESULTS_STREAM = "IB_REQUESTS", "IB_RESULTS"
#: Refusals that may pass later (trust fed back by the registry, a clock catching up).
_MAYBE_LATER = frozenset({"unknown_signer", "not_yet_valid"})
PENDING_BUCKET = "intentbus_pending"
WEEK = 7 * 24 * 3600.0


@dataclass(frozen=True, slots=True)
class DurableConfig:
    """Streams and consumers of async requests.

    Attributes:
        replicas: stream replicas (3 on a 3-node cluster survives one node lost).
        ack_wait: seconds before an unacknowledged request is redelivered (the executor
            working on it keeps it in progress, so this is how soon a dead executor's
            request moves on).
        lease: how long an executor's claim on a request holds without renewal; longer
            than a stream leader election (3.5-9 s measured), so a live executor cut off
            for a moment keeps its claim and nothing runs twice.
        max_deliver: deliveries before a request is given up; -1 (default): never, so
            accepted work is not dropped (unverifiable requests are terminated at once).
        max_lifetime: the longest ``expires_at - created_at`` an async request may have.
        workers: requests handled at once per intent and process.
        callbacks: retries of HTTP(S) callbacks.
    """

    replicas: int = 1
    ack_wait: float = 30.0
    lease: float = 30.0
    max_deliver: int = -1
    max_lifetime: float = WEEK
    workers: int = 16
    callbacks: CallbackPolicy = field(default_factory=CallbackPolicy)


async def ensure_streams(bus: Bus, config: DurableConfig) -> None:
    """Create the request and result streams unless they exist."""
    p = bus.subjects.prefix
    await bus.transport.ensure_stream(
        REQUESTS_STREAM, [f"{p}.durable.>"], replicas=config.replicas, max_age=WEEK
    )
    await bus.transport.ensure_stream(
        RESULTS_STREAM, [f"{p}.results.>"], replicas=config.replicas, max_age=WEEK
    )


async def send(
    bus: Bus,
    intent: str,
    payload: Any,
    *,
    reply_to: str | None = None,
    ttl: float = 3600.0,
    idempotency_key: str | None = None,
    publish_timeout: float = 30.0,
) -> Envelope:
    """Queue an async request durably; returns the sealed request (its id: ``message_id``).

    Publishing is retried (same ``Nats-Msg-Id``) until the server acknowledges it or
    ``publish_timeout`` passes, so a stream leader lost mid-publish stores it once.

    Raises:
        TransportError: not acknowledged within ``publish_timeout``.
    """
    bus._check_open()
    now = bus.now_ms()
    env, body = bus._sealer.seal(
        kind="request",
        intent=intent,
        payload=payload,
        correlation_id=new_id(),
        trace=new_trace(None),
        created_at=now,
        expires_at=now + int(ttl * 1000),
        reply_to=reply_to or bus.subjects.results(bus.agent_id),
        idempotency_key=idempotency_key or new_id(),
    )
    subject = bus.subjects.durable(intent)
    loop = asyncio.get_running_loop()
    give_up, pause = loop.time() + publish_timeout, 0.1
    while True:
        try:
            await bus.transport.publish_durable(subject, body, msg_id=env.message_id)
            return env
        except TransportError as exc:
            if loop.time() + pause > give_up:
                raise
            log.info("durable publish of %s not acknowledged (%s); retrying", env.message_id, exc)
            await asyncio.sleep(pause)
            pause = min(pause * 2, 2.0)


class Results:
    """This agent's async results, in the order they were stored; verified.

    Iterate with ``async for reply in results``; a reply is acknowledged (removed from the
    stream) when the next one is asked for, or at :meth:`close`, so a requester that dies
    while handling one reads it again after a restart.
    """

    def __init__(self, bus: Bus, consumer: PullConsumer, verifier: Verifier) -> None:
        self._bus, self._consumer, self._verifier = bus, consumer, verifier
        self._unacked: JsMsg | None = None

    @classmethod
    async def open(cls, bus: Bus, config: DurableConfig | None = None) -> Results:
        """Bind this agent's durable results consumer."""
        config = config or DurableConfig()
        await ensure_streams(bus, config)
        consumer = await bus.transport.pull_consumer(
            RESULTS_STREAM, f"ib-res-{bus.agent_id}", bus.subjects.results(bus.agent_id),
            ack_wait=config.ack_wait, max_deliver=config.max_deliver,
        )  # fmt: skip
        return cls(bus, consumer, _long_verifier(bus, config))

    async def next(self, timeout: float = 5.0) -> Envelope | None:
        """The next verified result (None when none came within ``timeout``)."""
        await self._ack_previous()
        loop = asyncio.get_running_loop()
        until = loop.time() + timeout
        while loop.time() < until:
            try:
                msgs = await self._consumer.fetch(1, timeout=max(0.05, until - loop.time()))
            except TransportError as exc:  # e.g. the stream's leader is being re-elected
                if _cancelling():
                    raise asyncio.CancelledError from exc
                log.info("results fetch failed (%s); retrying", exc)
                await asyncio.sleep(0.2)
                continue
            for msg in msgs:
                try:
                    reply = self._verifier.verify(msg.data, self._bus.now_ms(), ("reply",))
                except EnvelopeRejected as exc:
                    log.warning("refused a result: %s", exc)
                    await msg.term()
                    continue
                self._unacked = msg
                return reply
        return None

    def __aiter__(self) -> Results:
        return self

    async def __anext__(self) -> Envelope:
        while True:
            reply = await self.next(timeout=60.0)
            if reply is not None:
                return reply

    async def _ack_previous(self) -> None:
        msg, self._unacked = self._unacked, None
        if msg is not None:
            await msg.ack()

    async def close(self) -> None:
        """Acknowledge the last result handed out and stop pulling."""
        await self._ack_previous()
        await self._consumer.close()


def _long_verifier(bus: Bus, config: DurableConfig) -> Verifier:
    policy = VerificationPolicy(
        skew_ms=bus.policy.skew_ms, max_lifetime_ms=int(config.max_lifetime * 1000)
    )
    return Verifier(bus.trust, bus.agent_id, policy)


class DurableExecutor:
    """Serves async requests of some intents for one bus; owns its pulling tasks."""

    def __init__(
        self,
        bus: Bus,
        config: DurableConfig,
        idem: IdempotencyStore,
        deliverer: Deliverer,
        pending: KeyValue,
    ) -> None:
        self.bus, self.config, self._idem = bus, config, idem
        self.deliverer, self.pending = deliverer, pending
        self._verifier = _long_verifier(bus, config)
        self._handlers: dict[str, Handler] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._consumers: list[PullConsumer] = []
        self._closing = False
        self.executed = 0

    async def serve(self, intent: str, handler: Handler) -> None:
        """Start pulling async requests of ``intent``."""
        if intent in self._handlers:
            raise UsageError(f"intent {intent!r} is already served durably here")
        self._handlers[intent] = handler
        durable = f"ib-req-{intent.replace('.', '_')}"
        consumer = await self.bus.transport.pull_consumer(
            REQUESTS_STREAM, durable, self.bus.subjects.durable(intent),
            ack_wait=self.config.ack_wait, max_deliver=self.config.max_deliver,
        )  # fmt: skip
        self._consumers.append(consumer)
        loop = asyncio.get_running_loop()
        for _ in range(self.config.workers):
            task = loop.create_task(self._pull(consumer), name=f"intentbus-durable-{intent}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pull(self, consumer: PullConsumer) -> None:
        while not self._closing:
            try:
                msgs = await consumer.fetch(1, timeout=1.0)
            except TransportError as exc:
                # nats-py may turn a cancellation into a connection error: check, or a
                # close would wait on a task that swallowed its own cancellation
                if self._closing or _cancelling():
                    return
                log.info("pull failed (%s); retrying", exc)
                await asyncio.sleep(0.5)
                continue
            for msg in msgs:
                try:
                    await self._process(msg)
                except TransportError as exc:  # not acknowledged: it comes back
                    log.warning("async request left for redelivery: %s", exc)
                except Exception:
                    log.exception("async request processing failed; left for redelivery")

    async def _process(self, msg: JsMsg) -> None:
        now = self.bus.now_ms()
        try:
            env = self._verifier.verify(msg.data, now, ("request",))
        except EnvelopeRejected as exc:
            if exc.code in _MAYBE_LATER:  # e.g. a key the registry will feed back, a skewed clock
                log.info("async request not accepted yet (%s); later", exc)
                await msg.nak(delay=max(self.config.ack_wait, 5.0))
                return
            log.warning("refused an async request: %s", exc)
            await msg.term()  # never executed, never redelivered
            return
        handler = self._handlers.get(env.intent)
        key = self.key_of(env)
        lease = now + int(self.config.lease * 1000)
        claim = await self._idem.claim(key, lease, now, now + 1000)
        if not claim.run:
            if claim.result is None:  # another instance is on it: look again later
                await msg.nak(delay=self.config.ack_wait / 2)
                return
            await self._resend(msg, env, key, claim.result)  # never overwrite an outcome
            return
        if handler is None or env.expires_at <= now:
            error = ErrorInfo("no_handler" if handler is None else "deadline_exceeded", "not run")
            await self._finish(msg, env, key, None, error)
            return
        await self._execute(msg, env, key, handler, None, claim.owner)

    def key_of(self, env: Envelope) -> str:
        """The idempotency key of an async request (once per intent group)."""
        scope = f"d.{env.intent}"
        return idem_key(scope, env.sender.agent_id, env.idempotency_key or env.message_id)

    async def _execute(
        self,
        msg: JsMsg | None,
        env: Envelope,
        key: str,
        handler: Handler,
        review: Review | None,
        owner: str = "",
    ) -> str:
        """Run the handler and settle the request: returns ``parked`` or ``done``.

        Until the request is settled (outcome recorded, delivered, acknowledged) the
        message is kept in progress and the claim renewed: nobody else runs it meanwhile.
        """
        ticker = asyncio.get_running_loop().create_task(self._keep_alive(msg, key, owner))
        try:
            return await self._run_and_settle(msg, env, key, handler, review)
        finally:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker

    async def _run_and_settle(
        self, msg: JsMsg | None, env: Envelope, key: str, handler: Handler, review: Review | None
    ) -> str:
        try:
            self.executed += 1
            timeout = (env.expires_at - self.bus.now_ms()) / 1000
            steps = itertools.count(1)

            async def progress(data: Any) -> None:
                await self._deliver(env, data, None, f"working:{next(steps)}")

            scope = asyncio.timeout(timeout)
            async with scope:
                result = await handler(env.payload, Context(self.bus, env, review, progress))
            error = None
        except PendingReview as exc:
            await self._park(env, key, exc)
            if msg is not None:
                await msg.ack()
            return "parked"
        except TimeoutError as exc:
            if scope.expired():
                result, error = None, ErrorInfo("deadline_exceeded", "deadline passed")
            else:  # a nested call's own timeout
                result, error = None, _as_error(exc)
        except asyncio.CancelledError:
            if _cancelling():
                raise  # closing: left for redelivery
            result, error = None, ErrorInfo("handler_error", "CancelledError inside the handler")
        except Exception as exc:
            result, error = None, _as_error(exc)
        await self._finish(msg, env, key, result, error)
        return "done"

    async def _keep_alive(self, msg: JsMsg | None, key: str, owner: str) -> None:
        every = min(self.config.ack_wait, self.config.lease) / 3
        while True:
            await asyncio.sleep(every)
            try:  # a failed pass (a leader election) must not end the keep-alive
                if msg is not None:
                    await msg.in_progress()
                if owner:
                    lease = self.bus.now_ms() + int(self.config.lease * 1000)
                    await self._idem.renew(key, owner, lease)
            except Exception as exc:
                log.info("keep-alive of %s failed this pass: %s", key, exc)

    async def _finish(
        self, msg: JsMsg | None, env: Envelope, key: str, result: Any, error: ErrorInfo | None
    ) -> None:
        try:
            outcome = self._outcome(key, result, error)
        except (TypeError, ValueError):  # not JSON: say so, to the cache and the requester
            result, error = None, ErrorInfo("handler_error", "handler returned a non-JSON value")
            outcome = self._outcome(key, result, error)
        # the outcome must be on record before anything else: else a redelivery would run
        # the handler again. Through a leader election (seconds), keep trying.
        await _persist(lambda: self._idem.finish(key, outcome))
        await _persist(lambda: self._deliver(env, result, error, "final"))
        if msg is not None:
            await msg.ack()

    def _outcome(self, key: str, result: Any, error: ErrorInfo | None) -> dict[str, Any]:
        outcome = {"payload": result, "error": error and error.to_dict()}
        if self._idem.shared:
            outcome = seal_outcome(key, outcome, self.bus.key)
        return dict(outcome, status="final")

    async def _resend(self, msg: JsMsg, env: Envelope, key: str, stored: dict[str, Any]) -> None:
        if self._idem.shared and not verified_outcome(key, stored, self.bus.trust):
            log.error("unverifiable recorded outcome for %s; leaving it unanswered", key)
            await msg.term()
            return
        if stored.get("status") == "parked":
            await msg.ack()  # it waits for a reviewer, not for another run
            return
        error = stored.get("error")
        info = ErrorInfo(error["code"], error["message"], error.get("data")) if error else None
        await self._deliver(env, stored.get("payload"), info, "final")
        await msg.ack()

    async def _park(self, env: Envelope, key: str, exc: PendingReview) -> None:
        entry = {"request_id": env.message_id, "intent": env.intent, "reason": exc.reason,
                 "data": exc.data, "executor": self.bus.agent_id, "key": key,
                 "requester": env.sender.agent_id, "parked_at": self.bus.now_ms(),
                 "envelope": env.to_bytes().decode()}  # fmt: skip
        await self.pending.put(env.message_id, orjson.dumps(entry))  # first: reviewable
        marker: dict[str, Any] = {"payload": None, "error": None}
        if self._idem.shared:
            marker = seal_outcome(key, marker, self.bus.key)
        await self._idem.finish(key, dict(marker, status="parked"))
        info = {"reason": exc.reason, "data": exc.data}
        await self._deliver(env, info, None, "pending_review")

    async def _deliver(
        self, env: Envelope, result: Any, error: ErrorInfo | None, stage: str
    ) -> None:
        if not env.reply_to:
            return
        now = self.bus.now_ms()
        status = None if stage == "final" else stage.split(":")[0]
        _, body = self.bus._sealer.seal(
            kind="reply", intent=env.intent, payload=result, error=error, status=status,
            correlation_id=env.correlation_id, trace=new_trace(env.trace), created_at=now,
            expires_at=now + int(self.config.max_lifetime * 1000), recipient=env.sender,
            in_reply_to=env.message_id,
        )  # fmt: skip
        await self.deliverer.deliver(
            env.reply_to, body, f"{env.message_id}:{stage}", env.message_id
        )

    async def close(self, timeout: float = 5.0) -> None:
        """Stop pulling; requests in flight are left for redelivery (bounded by ``timeout``)."""
        self._closing = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=timeout)
            for task in stuck:
                log.error("durable worker %s did not stop within %ss", task.get_name(), timeout)
        for consumer in self._consumers:
            await consumer.close()
        await self.deliverer.close()


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def _persist(op: Callable[[], Awaitable[None]], patience: float = 60.0) -> None:
    """Run ``op`` until it succeeds, backing off on transport errors, for ``patience`` s."""
    loop = asyncio.get_running_loop()
    give_up, pause = loop.time() + patience, 0.1
    while True:
        try:
            await op()
            return
        except TransportError:
            if loop.time() + pause > give_up:
                raise
            await asyncio.sleep(pause)
            pause = min(pause * 2, 2.0)


def _as_error(exc: Exception) -> ErrorInfo:
    from .context import HandlerError
    from .errors import RemoteError

    if isinstance(exc, HandlerError):
        return ErrorInfo(exc.code, exc.message, exc.data)
    if isinstance(exc, RemoteError):
        return ErrorInfo(
            "upstream_error", exc.detail, {"origin": exc.sender, "origin_code": exc.code}
        )
    log.warning("async handler raised %s", exc, exc_info=True)
    return ErrorInfo("handler_error", f"{type(exc).__name__}: {exc}")
