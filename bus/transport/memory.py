"""An in-memory twin of the NATS transport, for fast unit tests.

It honours what the bus relies on: ``*``/``>`` wildcards, one delivery per queue
group (round-robin, so tests are deterministic), in-order delivery per
subscription, no-responders status messages, and KV buckets with a TTL and an
atomic create. Several :class:`MemoryTransport` connections share one
:class:`MemoryBroker`, as several processes share one server.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..errors import TransportError
from .base import KeyValue, MsgHandler, Subscription

__all__ = ["MemoryBroker", "MemoryMsg", "MemoryTransport", "subject_matches"]


@dataclass(frozen=True, slots=True)
class MemoryMsg:
    """A delivered message."""

    subject: str
    data: bytes
    reply: str = ""
    headers: Mapping[str, str] | None = None


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS matching: ``*`` is one token, a final ``>`` is one or more tokens."""
    p, s = pattern.split("."), subject.split(".")
    for i, tok in enumerate(p):
        if tok == ">":
            return len(s) > i
        if i >= len(s) or (tok != "*" and tok != s[i]):
            return False
    return len(p) == len(s)


class _MemorySub:
    def __init__(self, owner: MemoryTransport, subject: str, queue: str, handler: MsgHandler):
        self.owner, self.subject, self.queue, self.handler = owner, subject, queue, handler
        self.inbox: asyncio.Queue[MemoryMsg] = asyncio.Queue()
        self.task = asyncio.get_running_loop().create_task(self._deliver())

    async def _deliver(self) -> None:
        while True:
            msg = await self.inbox.get()
            try:
                await self.handler(msg)
            except Exception as exc:  # a handler bug must not stop delivery, as in nats-py
                self.owner.errors.append(exc)

    async def unsubscribe(self) -> None:
        self.owner.broker.subs.discard(self)
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


class _MemoryKV:
    def __init__(self, ttl: float, clock: Callable[[], float]) -> None:
        self._ttl, self._clock = ttl, clock
        self._data: dict[str, tuple[float, bytes]] = {}

    def _live(self, key: str) -> bytes | None:
        item = self._data.get(key)
        if item is None or (self._ttl and item[0] + self._ttl <= self._clock()):
            self._data.pop(key, None)
            return None
        return item[1]

    async def create(self, key: str, value: bytes) -> bool:
        if self._live(key) is not None:
            return False
        self._data[key] = (self._clock(), value)
        return True

    async def get(self, key: str) -> bytes | None:
        return self._live(key)

    async def put(self, key: str, value: bytes) -> None:
        self._data[key] = (self._clock(), value)

    async def delete(self, key: str) -> None:
        self._data.pop(key, None)


class MemoryBroker:
    """The shared in-process 'server'. ``clock`` drives KV expiry (inject it in tests)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.subs: set[_MemorySub] = set()
        self.buckets: dict[str, _MemoryKV] = {}
        self.clock = clock
        self._rr = itertools.count()

    def connect(self) -> MemoryTransport:
        """A new connection to this broker."""
        return MemoryTransport(self)

    def route(
        self, subject: str, data: bytes, reply: str, headers: Mapping[str, str] | None
    ) -> int:
        msg = MemoryMsg(subject, data, reply, headers)
        groups: dict[str, list[_MemorySub]] = {}
        delivered = 0
        for sub in self.subs:
            if subject_matches(sub.subject, subject):
                if sub.queue:
                    groups.setdefault(sub.queue, []).append(sub)
                else:
                    sub.inbox.put_nowait(msg)
                    delivered += 1
        for members in groups.values():
            members.sort(key=id)
            members[next(self._rr) % len(members)].inbox.put_nowait(msg)
            delivered += 1
        return delivered


class MemoryTransport:
    """One connection to a :class:`MemoryBroker`; see :class:`bus.transport.base.Transport`."""

    def __init__(self, broker: MemoryBroker | None = None) -> None:
        self.broker = broker or MemoryBroker()
        self.errors: list[BaseException] = []
        self._subs: list[_MemorySub] = []
        self._closed = False

    @property
    def url(self) -> str:
        return "memory://"

    def new_inbox(self) -> str:
        return "_INBOX." + os.urandom(11).hex()

    def _check_open(self) -> None:
        if self._closed:
            raise TransportError("connection closed")

    async def publish(
        self,
        subject: str,
        data: bytes,
        *,
        reply: str = "",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self._check_open()
        if not self.broker.route(subject, data, reply, headers) and reply:
            self.broker.route(reply, b"", "", {"Status": "503"})

    async def subscribe(
        self, subject: str, handler: MsgHandler, *, queue: str = ""
    ) -> Subscription:
        self._check_open()
        sub = _MemorySub(self, subject, queue, handler)
        self.broker.subs.add(sub)
        self._subs.append(sub)
        return sub

    async def key_value(self, bucket: str, *, ttl: float) -> KeyValue:
        self._check_open()
        return self.broker.buckets.setdefault(bucket, _MemoryKV(ttl, self.broker.clock))

    async def flush(self, timeout: float = 5.0) -> None:
        self._check_open()
        await asyncio.sleep(0)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for sub in self._subs:
            await sub.unsubscribe()
