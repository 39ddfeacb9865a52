"""The watch-fed cache: every live, trusted record in memory, indexed for look-ups.

One task, owned by the cache, follows a KV watch. Each (re)start of the watch first
collects the bucket's current values, then replaces the cache with exactly that
snapshot (entries that vanished while disconnected are dropped, none is doubled), and
from then on applies changes one by one. A reconnect of the transport restarts it.

Admission: a record enters only if it is well formed, signed by its own key, that key is
trusted (in the trust store, or endorsed by a configured operator key), not revoked, and
its heartbeat is within ``ttl_ms`` (+ skew). Records the server expires arrive as
deletions (per-key TTL with delete markers); a sweep drops any the cache outlives anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from bus import PublicKey, TrustStore
from bus.transport.base import KeyValue, KeyWatch, KVEvent

from .index import Index
from .record import AgentRecord, RecordRejected, decode_record, jws_verify, verify_endorsement

__all__ = ["AGENT_PREFIX", "REVOKED_PREFIX", "RegistryCache"]

log = logging.getLogger("intentbus.registry")
AGENT_PREFIX = "agents."
REVOKED_PREFIX = "revoked."


class RegistryCache(Index):
    """Follows the registry bucket; look-ups are in-memory (see :class:`Index`).

    Args:
        kv: the registry bucket.
        trust: keys trusted directly; endorsed keys are added to it while their record
            lives, and removed when it goes (the trust feed).
        operators: keys whose endorsements make an agent's key trusted.
        now_ms: clock, Unix ms.
        skew_ms: tolerance on heartbeat age.
        require_trust: refuse records whose key is neither trusted nor endorsed. Only
            an inspection tool (``intentbus agents ls``) turns this off, to list them.
    """

    def __init__(
        self,
        kv: KeyValue,
        *,
        trust: TrustStore,
        operators: list[PublicKey] | None = None,
        now_ms: Callable[[], int],
        skew_ms: int = 2_000,
        require_trust: bool = True,
    ) -> None:
        super().__init__()
        self._kv, self.trust, self.operators = kv, trust, list(operators or [])
        self._now_ms, self._skew_ms, self.require_trust = now_ms, skew_ms, require_trust
        self._fed: set[str] = set()  # kids this cache added to the trust store
        self.revoked: set[str] = set()
        self.refused: dict[str, int] = {}
        self._watch: KeyWatch | None = None
        self._task: asyncio.Task[None] | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._synced = asyncio.Event()
        self._closing = False

    async def start(self, timeout: float = 10.0) -> None:
        """Start following; returns once the current contents are loaded."""
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._follow(), name="intentbus-registry-watch")
        self._sweeper = loop.create_task(self._sweep(), name="intentbus-registry-sweep")
        try:
            async with asyncio.timeout(timeout):
                await self._synced.wait()
        except BaseException:
            await self.close()
            raise

    async def resync(self) -> None:
        """Restart the watch (after a reconnect): the next snapshot replaces the cache."""
        watch = self._watch
        if watch is not None:
            await watch.stop()

    async def close(self) -> None:
        """Stop the watch and the sweep (idempotent)."""
        self._closing = True
        for task in (self._task, self._sweeper):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._watch is not None:
            await self._watch.stop()
        self._task = self._sweeper = self._watch = None

    async def _follow(self) -> None:
        while not self._closing:
            try:
                self._watch = await self._kv.watch()
                snapshot: dict[str, KVEvent] | None = {}
                async for event in self._watch:
                    if event is None:
                        if snapshot is not None:
                            self._replace(snapshot)
                            snapshot = None
                            self._synced.set()
                    elif snapshot is not None:
                        snapshot[event.key] = event
                    else:
                        self._apply(event)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the link broke: wait, then watch again
                log.warning("registry watch failed (%s); retrying", exc)
                await asyncio.sleep(0.5)

    def _replace(self, snapshot: dict[str, KVEvent]) -> None:
        # revocations seen stay in force even if their key vanished meanwhile
        for event in snapshot.values():
            if event.key.startswith(REVOKED_PREFIX):
                self._apply(event)
        seen = set()
        for event in snapshot.values():
            if event.key.startswith(AGENT_PREFIX):
                seen.add(event.key[len(AGENT_PREFIX) :])
                self._apply(event)
        for agent_id in [a for a in self.records if a not in seen]:
            self._drop(agent_id)

    def _apply(self, event: KVEvent) -> None:
        if event.key.startswith(REVOKED_PREFIX):
            self._apply_revocation(event)
        elif event.key.startswith(AGENT_PREFIX):
            agent_id = event.key[len(AGENT_PREFIX) :]
            if event.value is None:
                self._drop(agent_id)
                return
            try:
                record = self.admit(event.value)
                if record.agent_id != agent_id:
                    raise RecordRejected(
                        "malformed", f"record of {record.agent_id} under {agent_id}"
                    )
            except RecordRejected as exc:
                self.refused[exc.code] = self.refused.get(exc.code, 0) + 1
                log.warning("registry refused the record of %s: %s", agent_id, exc)
                self._drop(agent_id)
                return
            self._upsert(record)

    def admit(self, data: bytes) -> AgentRecord:
        """Decode and check a record (see the module docstring); raise RecordRejected."""
        record = decode_record(data)
        if not record.self_signed():
            raise RecordRejected("bad_signature", "the record's signature does not verify")
        if record.key.kid in self.revoked:
            raise RecordRejected("revoked", f"key {record.key.kid} was revoked")
        if self.require_trust and self.trust_of(record) == "untrusted":
            raise RecordRejected(
                "unknown_signer", f"key {record.key.kid} is neither trusted nor endorsed"
            )
        if record.expires_at + self._skew_ms < self._now_ms():
            raise RecordRejected("expired", "the record's last heartbeat is too old")
        return record

    def trust_of(self, record: AgentRecord) -> str:
        """``trusted`` (key in the trust store), ``endorsed`` (by an operator) or ``untrusted``."""
        if self.trust.get(record.key.kid) == record.key and record.key.kid not in self._fed:
            return "trusted"
        return "endorsed" if verify_endorsement(record, self.operators) else "untrusted"

    def _apply_revocation(self, event: KVEvent) -> None:
        kid = event.key[len(REVOKED_PREFIX) :]
        if event.value is None:
            return  # a revocation is signed; deleting it (anyone can) does not undo it
        if not any(jws_verify(_json(event.value), {"revoked": kid}, op) for op in self.operators):
            self.refused["bad_signature"] = self.refused.get("bad_signature", 0) + 1
            return
        self.revoked.add(kid)
        for record in [r for r in self.records.values() if r.key.kid == kid]:
            self._drop(record.agent_id)
        if kid in self._fed:  # a key rotated away from, still fed: stop trusting it too
            self._fed.discard(kid)
            self.trust.remove(kid)

    def _upsert(self, record: AgentRecord) -> None:
        old = self.get(record.agent_id)
        if old is not None and old.key != record.key and old.key.kid in self._fed:
            self._fed.discard(old.key.kid)  # key rotation: the old key is trusted no longer
            self.trust.remove(old.key.kid)
        self.put(record)
        kid = record.key.kid
        if kid not in self.trust and self.trust_of(record) == "endorsed":
            self.trust.add(record.key)
            self._fed.add(kid)

    def _drop(self, agent_id: str) -> None:
        record = self.remove(agent_id)
        if record is not None and record.key.kid in self._fed:
            self._fed.discard(record.key.kid)
            self.trust.remove(record.key.kid)

    async def _sweep(self, every: float = 1.0) -> None:
        while True:
            await asyncio.sleep(every)
            limit = self._now_ms() - self._skew_ms
            for record in [r for r in self.records.values() if r.expires_at < limit]:
                self._drop(record.agent_id)


def _json(data: bytes) -> Any:
    import orjson

    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
