"""Replay protection: remember each authentic message id for its acceptance window.

Two guards share one contract, :class:`ReplayGuard`:

* :class:`SharedReplayGuard` (the default) keeps seen ids in a JetStream KV bucket
  whose TTL covers the acceptance window; an atomic *create* refuses a second
  delivery to **any** instance of a queue group, in any process;
* :class:`LocalReplayGuard` keeps them in this process only. It costs no round
  trip, but a replay routed to another instance of the queue group is accepted
  there. Choose it for single-instance agents, or where NATS permissions already
  stop anyone from re-publishing captured messages.

Keys are ``<scope>.<sender>.<message_id>``. The scope is the recipient for an
addressed envelope (whatever subject carried it), otherwise the queue group (or the
receiving agent, for events without a group): an envelope legitimately delivered to
several groups is accepted once by each, and one sender cannot block another's ids.
"""

from __future__ import annotations

import heapq
from typing import Protocol

from .transport.base import KeyValue

__all__ = ["LocalReplayGuard", "ReplayGuard", "SharedReplayGuard", "replay_key"]


def replay_key(scope: str, sender: str, message_id: str) -> str:
    """The seen-ids key of one delivery scope."""
    return f"{scope}.{sender}.{message_id}"


class ReplayGuard(Protocol):
    """Contract: ``first_seen`` returns True exactly once per key within its window.

    ``until_ms`` is when the envelope stops being acceptable anyway (its expiry plus
    the skew); the guard must remember the key at least until then.
    """

    async def first_seen(self, key: str, until_ms: int, now_ms: int) -> bool:
        """Record ``key``; False when it was already recorded (a replay)."""
        ...


class LocalReplayGuard:
    """Per-process seen-ids with expiry; memory is bounded by the traffic of one window."""

    def __init__(self) -> None:
        self._seen: dict[str, int] = {}
        self._expiry: list[tuple[int, str]] = []

    async def first_seen(self, key: str, until_ms: int, now_ms: int) -> bool:
        """See :class:`ReplayGuard`."""
        return self.first_seen_sync(key, until_ms, now_ms)

    def first_seen_sync(self, key: str, until_ms: int, now_ms: int) -> bool:
        """The same check without a coroutine, for callers on the hot path."""
        expiry = self._expiry
        while expiry and expiry[0][0] < now_ms:
            _, old = heapq.heappop(expiry)
            if self._seen.get(old, now_ms) < now_ms:
                del self._seen[old]
        if key in self._seen:
            return False
        self._seen[key] = until_ms
        heapq.heappush(expiry, (until_ms, key))
        return True

    def __len__(self) -> int:
        return len(self._seen)


class SharedReplayGuard:
    """Seen-ids in a KV bucket shared by every process of the fleet.

    Args:
        kv: a bucket whose TTL is at least the acceptance window
            (:attr:`bus.signing.VerificationPolicy.replay_window_ms`).
    """

    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv

    async def first_seen(self, key: str, until_ms: int, now_ms: int) -> bool:
        """See :class:`ReplayGuard`; one atomic create on the server."""
        return await self._kv.create(key, b"")
