"""The registry client: register with heartbeats, look up by intent and selector.

Storage is the JetStream KV bucket ``intentbus_registry`` (file storage): records under
``agents.<agent_id>``, operator revocations under ``revoked.<kid>``. Liveness uses the
server's **per-key TTL**: every heartbeat re-puts the record with ``ttl`` seconds to live,
and when an agent stops, the server expires the key and places a delete marker that
every watcher sees. Heartbeats run every ``ttl / 3``, so two may be lost before the
record expires; a stopped agent is gone within ``ttl`` (+ the cache's skew).
A graceful stop deletes the key at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from bus import KeyPair, PublicKey, TrustStore
from bus.transport.base import KeyValue, Storage, Transport

from .cache import AGENT_PREFIX, REVOKED_PREFIX, RegistryCache
from .record import AgentRecord, jws_sign

__all__ = ["DEFAULT_TTL", "REGISTRY_BUCKET", "Registration", "Registry"]

log = logging.getLogger("intentbus.registry")
REGISTRY_BUCKET = "intentbus_registry"
DEFAULT_TTL = 15.0


class Registration:
    """One agent's live record: heartbeats until :meth:`stop`, which deregisters.

    Owned by whoever called :meth:`Registry.register`; the heartbeat task is its own.
    """

    def __init__(
        self, kv: KeyValue, record: AgentRecord, key: KeyPair, ttl: float, now_ms: Callable[[], int]
    ):
        self._kv, self.record, self._key, self.ttl, self._now_ms = kv, record, key, ttl, now_ms
        self._task: asyncio.Task[None] | None = None
        self.heartbeats = 0

    async def start(self) -> None:
        """Write the record now, then keep it alive."""
        await self._beat()
        self._task = asyncio.get_running_loop().create_task(
            self._loop(), name="intentbus-heartbeat"
        )

    async def _beat(self) -> None:
        self.record.heartbeat_at = self._now_ms()
        self.record.signed(self._key)
        await self._kv.put(
            AGENT_PREFIX + self.record.agent_id, self.record.to_bytes(), ttl=self.ttl
        )
        self.heartbeats += 1

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.ttl / 3)
            try:
                await self._beat()
            except Exception as exc:  # keep trying: the record lives ttl, not one beat
                log.warning("heartbeat of %s failed: %s", self.record.agent_id, exc)

    async def stop(self, deregister: bool = True) -> None:
        """Stop heartbeating; with ``deregister`` the record is deleted at once."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if deregister:
            try:
                await self._kv.delete(AGENT_PREFIX + self.record.agent_id)
            except Exception as exc:
                log.warning("deregistering %s failed: %s", self.record.agent_id, exc)


class Registry(RegistryCache):
    """Registry access for one process: the watch-fed cache plus registration.

    Build with :meth:`open`. It implements the bus's ``Directory`` (``pick_agent``), so
    ``bus.directory = registry`` makes ``bus.request(..., selector=...)`` work.
    """

    def __init__(
        self, kv: KeyValue, *, clock: Callable[[], float] = time.time, **cache_options: Any
    ):
        self._clock = clock
        super().__init__(kv, now_ms=lambda: int(self._clock() * 1000), **cache_options)
        self.kv = kv
        self._registrations: list[Registration] = []

    @classmethod
    async def open(
        cls,
        transport: Transport,
        *,
        trust: TrustStore,
        operators: list[PublicKey] | None = None,
        storage: Storage = "file",
        replicas: int = 1,
        bucket: str = REGISTRY_BUCKET,
        clock: Callable[[], float] = time.time,
        require_trust: bool = True,
    ) -> Registry:
        """Open (creating if needed) the bucket and load the cache.

        Returns once the cache holds the registry's current contents; it follows every
        change from then on, and resynchronises after a reconnect.
        """
        kv = await transport.key_value(
            bucket, storage=storage, replicas=replicas, expiry_events=True
        )
        registry = cls(
            kv, trust=trust, operators=operators, clock=clock, require_trust=require_trust
        )
        await registry.start()
        transport.on_reconnect(registry.resync)
        return registry

    async def register(
        self,
        key: KeyPair,
        intents: list[str],
        labels: dict[str, str],
        *,
        ttl: float = DEFAULT_TTL,
        card: dict[str, Any] | None = None,
        version: str = "0",
        endorsement: dict[str, str] | None = None,
    ) -> Registration:
        """Register ``key``'s agent and keep it alive; returns its :class:`Registration`."""
        record = AgentRecord.build(
            key, intents, labels, now_ms=self._now_ms(), ttl_ms=int(ttl * 1000),
            card=card, version=version, endorsement=endorsement,
        )  # fmt: skip
        registration = Registration(self.kv, record, key, ttl, self._now_ms)
        await registration.start()
        self._registrations.append(registration)
        return registration

    async def revoke(self, operator: KeyPair, kid: str) -> None:
        """Record an operator's revocation of key ``kid``: every cache drops its records
        and stops trusting it, and it cannot register again while the revocation stands."""
        await self.kv.put(REVOKED_PREFIX + kid, _dumps(jws_sign(operator, {"revoked": kid})))

    async def close(self) -> None:
        """Deregister what this process registered, then stop following (idempotent)."""
        registrations, self._registrations = self._registrations, []
        for registration in reversed(registrations):
            await registration.stop()
        await super().close()


def _dumps(obj: Any) -> bytes:
    import orjson

    return orjson.dumps(obj)
