"""Idempotency: an executor runs a request at most once per idempotency key.

Every request carries an ``idempotency_key`` (by default its first attempt's message
id; retries reuse it). Before a handler runs, the executor claims the key with an
atomic *create* of ``pending``; a second delivery (a retry, or a duplicate sent to
another instance of the queue group) finds the claim and waits for the outcome, then
answers with the cached result, re-sealed for its own envelope. Keys are scoped by
intent and sender: ``<intent>.<sender>.<key>``.

If the claimant dies, its claim carries the deadline of the attempt it served; once
that has passed, a later attempt may take the claim over. A handler cancelled at its
deadline releases its claim, so a retry runs it again (document-level: a handler that
must never run twice completes or checkpoints before its deadline).

Two stores, chosen with the bus's replay mode: :class:`SharedIdempotency` (JetStream
KV, fleet-wide) and :class:`LocalIdempotency` (this process).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from .canonical import canonicalize
from .errors import TransportError
from .ids import new_id
from .keys import KeyPair, b64url_decode, b64url_encode
from .transport.base import KeyValue
from .transport.memory import MemoryKeyValue
from .trust import TrustStore

__all__ = [
    "Claim",
    "IdempotencyStore",
    "LocalIdempotency",
    "SharedIdempotency",
    "idem_key",
    "seal_outcome",
    "verified_outcome",
]

POLL_SECONDS = 0.05


def idem_key(scope: str, sender: str, key: str) -> str:
    """The store key of one request: ``scope`` is the queue group (or the agent)."""
    return f"{scope}.{sender}.{key}"


def seal_outcome(store_key: str, outcome: dict[str, Any], signer: KeyPair) -> dict[str, Any]:
    """An outcome signed by the executor that produced it (over its key and content), so
    a value planted in the shared bucket by anyone else is never replayed as a reply."""
    body = {"key": store_key, "payload": outcome.get("payload"), "error": outcome.get("error")}
    sig = b64url_encode(signer.sign(canonicalize(body)))
    return dict(body, by=signer.agent_id, kid=signer.kid, sig=sig)


def verified_outcome(store_key: str, stored: dict[str, Any], trust: TrustStore) -> bool:
    """True when ``stored`` was sealed for ``store_key`` by a trusted key of its ``by``."""
    key = trust.get(str(stored.get("kid")))
    if key is None or key.agent_id != stored.get("by") or stored.get("key") != store_key:
        return False
    body = {"key": store_key, "payload": stored.get("payload"), "error": stored.get("error")}
    try:
        return key.verify(canonicalize(body), b64url_decode(str(stored.get("sig"))))
    except (TypeError, ValueError):
        return False


@dataclass(frozen=True, slots=True)
class Claim:
    """The outcome of :meth:`IdempotencyStore.claim`: ``run`` the handler, or a ``result``
    (``{"payload": ..., "error": {...} | None}``) recorded by an earlier delivery."""

    run: bool
    result: dict[str, Any] | None = None
    owner: str = ""


class IdempotencyStore(Protocol):
    """Contract: at most one ``claim`` per key returns ``run=True`` until it is released.

    ``shared`` says whether others can write the store: outcomes kept there are sealed by
    the executor and verified before they are served again.
    """

    shared: bool

    async def claim(self, key: str, lease_until_ms: int, now_ms: int, wait_until_ms: int) -> Claim:
        """Claim ``key``; if claimed already, wait (until ``wait_until_ms``) for its result.

        Returns ``Claim(run=False)`` with no result when the wait ran out.
        """
        ...

    async def renew(self, key: str, owner: str, lease_until_ms: int) -> None:
        """Extend the lease of a claim we hold."""
        ...

    async def take_parked(self, key: str, lease_until_ms: int) -> str | None:
        """Turn a parked request's record into our claim; the owner token, or None if it
        is not parked (any more): one reviewer's decision runs, never two."""
        ...

    async def finish(self, key: str, result: dict[str, Any]) -> None:
        """Record the outcome of a claimed key."""
        ...

    async def release(self, key: str, owner: str = "") -> None:
        """Give our claim up without an outcome (the handler did not complete)."""
        ...


class _KVStore:
    shared = True

    def __init__(self, kv: KeyValue, clock_ms: Any) -> None:
        self._kv = kv
        self._clock_ms = clock_ms

    async def claim(self, key: str, lease_until_ms: int, now_ms: int, wait_until_ms: int) -> Claim:
        owner = new_id()  # tells our own claim apart when a create's answer was lost
        pending = orjson.dumps({"state": "pending", "until": lease_until_ms, "owner": owner})
        while True:
            try:
                if await self._kv.create(key, pending):
                    return Claim(run=True, owner=owner)
            except TransportError:
                if self._clock_ms() >= wait_until_ms:
                    raise
                await asyncio.sleep(POLL_SECONDS)
                continue  # the create may or may not have been stored: look
            found = await self._kv.entry(key)
            if found is None:
                continue  # released or expired between the two calls: claim again
            state, revision = orjson.loads(found[0]), found[1]
            if state.get("owner") == owner:
                return Claim(run=True, owner=owner)
            if state.get("state") == "done":
                return Claim(run=False, result=state)
            now = self._clock_ms()
            if state.get("until", 0) < now:  # the claimant's lease ran out: take over,
                taken = dict(state, until=lease_until_ms, owner=owner)  # only if unchanged
                if await self._kv.update(key, orjson.dumps(taken), revision):
                    return Claim(run=True, owner=owner)
                continue
            if now >= wait_until_ms:
                return Claim(run=False)
            await asyncio.sleep(POLL_SECONDS)

    async def renew(self, key: str, owner: str, lease_until_ms: int) -> None:
        """Extend our claim's lease while the work goes on (no-op if it is not ours, or
        no longer pending: a revision check keeps a renewal from undoing an outcome)."""
        found = await self._kv.entry(key)
        if found is not None:
            state = orjson.loads(found[0])
            if state.get("state") == "pending" and state.get("owner") == owner:
                state["until"] = lease_until_ms
                await self._kv.update(key, orjson.dumps(state), found[1])

    async def take_parked(self, key: str, lease_until_ms: int) -> str | None:
        found = await self._kv.entry(key)
        if found is None or orjson.loads(found[0]).get("status") != "parked":
            return None
        owner = new_id()
        claim = {"state": "pending", "until": lease_until_ms, "owner": owner}
        return owner if await self._kv.update(key, orjson.dumps(claim), found[1]) else None

    async def finish(self, key: str, result: dict[str, Any]) -> None:
        await self._kv.put(key, orjson.dumps(dict(result, state="done")))

    async def release(self, key: str, owner: str = "") -> None:
        """Give up our claim (only ours, and only while it is still pending)."""
        found = await self._kv.entry(key)
        if found is not None:
            state = orjson.loads(found[0])
            if state.get("state") == "pending" and (not owner or state.get("owner") == owner):
                await self._kv.delete_if(key, found[1])


class SharedIdempotency(_KVStore):
    """Claims and results in a KV bucket every instance of the fleet shares.

    Args:
        kv: a bucket whose TTL is how long results are kept for retries.
        clock_ms: the bus clock, Unix ms.
    """


class LocalIdempotency(_KVStore):
    """The same rules in this process only (an in-memory bucket).

    Args:
        clock_ms: the bus clock, Unix ms.
        ttl: how long results are kept, seconds.
    """

    shared = False

    def __init__(self, clock_ms: Any, ttl: float) -> None:
        super().__init__(MemoryKeyValue(ttl, time.monotonic), clock_ms)
