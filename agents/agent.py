"""The agent runtime: declare intents and labels, then start, run and stop.

::

    agent = Agent("executor-eu-1", labels={"framework": "hermes", "env": "prod"})

    @agent.handles("task.execute")
    async def execute(payload, ctx):
        facts = await ctx.request("facts.lookup", {"q": payload["q"]})
        return {"answer": facts.payload}

    agent.run()  # embedded NATS when no URL is given

Contract for handlers: ``async def handler(payload, ctx) -> JSON``. Handlers run
concurrently (up to the bus's ``concurrency``), are cancelled when the request's
deadline passes, and must let :class:`asyncio.CancelledError` propagate. Raise
:class:`bus.HandlerError` for an error reply with your own code; any other
exception becomes a ``handler_error`` reply. Never block the event loop.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from bus import Bus, KeyPair, PublicKey, TrustStore, UsageError
from bus.receive import Handler
from bus.subjects import validate_agent_id, validate_intent
from bus.transport.base import Transport
from registry import DEFAULT_TTL, Registry

__all__ = ["Agent"]


class Agent:
    """One agent of a fleet.

    Args:
        agent_id: unique id; also the subject token that addresses this agent.
        labels: what the agent is (``framework=hermes``, ``env=prod``...); used by the
            registry for selector look-ups.
        key: signing key; a fresh one is generated when None.
        trust: public keys (or a shared TrustStore) whose envelopes are accepted.
        framework: the ``sender.framework`` of this agent's envelopes.
        registry: register in the fleet registry (with heartbeats) and attach it to
            the bus, so ``selector=`` requests work; False for a registry-less agent.
        operators: operator keys whose endorsements make other agents' keys trusted.
        endorsement: this agent's endorsement by an operator (see ``registry.endorse``).
        ttl: registry liveness bound, seconds (heartbeats every ttl/3).
        card: the A2A agent card published in the registry (default: from the intents).
    """

    def __init__(
        self,
        agent_id: str,
        *,
        labels: Mapping[str, str] | None = None,
        key: KeyPair | None = None,
        trust: TrustStore | Iterable[PublicKey] = (),
        framework: str = "intentbus",
        registry: bool = True,
        operators: Iterable[PublicKey] = (),
        endorsement: dict[str, str] | None = None,
        ttl: float = DEFAULT_TTL,
        card: dict[str, Any] | None = None,
    ) -> None:
        self.agent_id = validate_agent_id(agent_id)
        self.labels = dict(labels or {})
        if key is not None and key.agent_id != agent_id:
            raise UsageError(f"key belongs to {key.agent_id!r}, not {agent_id!r}")
        self.key = key or KeyPair.generate(agent_id)
        self.trust = trust if isinstance(trust, TrustStore) else TrustStore(trust)
        self.framework = framework
        self.use_registry, self.operators = registry, list(operators)
        self.endorsement, self.ttl, self.card = endorsement, ttl, card
        self._handlers: dict[str, tuple[Handler, str | None]] = {}
        self._durable: dict[str, tuple[Handler, set[str] | None]] = {}
        self._bus: Bus | None = None
        self.registry: Registry | None = None

    @property
    def public_key(self) -> PublicKey:
        """This agent's public key, to hand to peers' trust stores."""
        return self.key.public

    @property
    def intents(self) -> list[str]:
        """Declared intents."""
        return list(self._handlers)

    @property
    def bus(self) -> Bus:
        """The live bus; raises UsageError before :meth:`start`."""
        if self._bus is None:
            raise UsageError(f"agent {self.agent_id!r} is not started")
        return self._bus

    def handles(
        self,
        intent: str,
        *,
        queue: str | None = None,
        durable: bool = False,
        reviewers: set[str] | None = None,
    ) -> Callable[[Handler], Handler]:
        """Decorator: serve ``intent`` with the decorated coroutine function.

        With ``durable`` it serves async requests (``bus.send``) from the durable stream
        too; ``reviewers`` limits who may approve the requests it parks.
        """
        validate_intent(intent)

        def register(fn: Handler) -> Handler:
            if intent in self._handlers:
                raise UsageError(f"intent {intent!r} is declared twice on {self.agent_id!r}")
            self._handlers[intent] = (fn, queue)
            if durable:
                self._durable[intent] = (fn, reviewers)
            return fn

        return register

    async def start(
        self, url: str | None = None, *, transport: Transport | None = None, **bus_options: Any
    ) -> Bus:
        """Connect (embedded nats-server when neither ``url`` nor ``transport``) and serve.

        Returns once every declared intent is subscribed.
        """
        if self._bus is not None:
            raise UsageError(f"agent {self.agent_id!r} is already started")
        bus = await Bus.connect(
            url,
            key=self.key,
            transport=transport,
            trust=self.trust,
            framework=self.framework,
            **bus_options,
        )
        self._bus = bus
        try:
            for intent, (fn, queue) in self._handlers.items():
                await bus.handle(intent, fn, queue=queue)
            for intent, (fn, reviewers) in self._durable.items():
                await bus.serve_durable(intent, fn, reviewers=reviewers)
            if self.use_registry:
                await self._register(bus)
        except BaseException:
            await self.stop()
            raise
        return bus

    async def _register(self, bus: Bus) -> None:
        self.registry = await Registry.open(
            bus.transport, trust=self.trust, operators=self.operators
        )
        bus.directory = self.registry
        await self.registry.register(
            self.key, self.intents, self.labels, ttl=self.ttl, card=self.card,
            endorsement=self.endorsement, version=self.framework,
        )  # fmt: skip

    async def stop(self) -> None:
        """Deregister, drain and disconnect, in that order (idempotent)."""
        registry, self.registry = self.registry, None
        if registry is not None:
            await registry.close()
        bus, self._bus = self._bus, None
        if bus is not None:
            await bus.close()

    async def serve_forever(self, url: str | None = None, **bus_options: Any) -> None:
        """Start, wait for SIGINT/SIGTERM, stop."""
        await self.start(url, **bus_options)
        try:
            await wait_for_signal()
        finally:
            await self.stop()

    def run(self, url: str | None = None, **bus_options: Any) -> None:
        """Blocking entry point for scripts: :meth:`serve_forever` in a new event loop.

        As the composition root of an agent script it reads ``INTENTBUS_NATS_URL`` (when
        ``url`` is None) and ``INTENTBUS_NATS_SERVER`` (the binary to embed).
        """
        url = url or os.environ.get("INTENTBUS_NATS_URL") or None
        bus_options.setdefault("nats_server", os.environ.get("INTENTBUS_NATS_SERVER") or None)
        asyncio.run(self.serve_forever(url, **bus_options))


async def wait_for_signal() -> None:
    """Return when the process receives SIGINT or SIGTERM."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
