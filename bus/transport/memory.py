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
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from ..errors import TransportError
from .base import (
    KeyValue,
    KeyWatch,
    KVEvent,
    MsgHandler,
    PullConsumer,
    Storage,
    Subscription,
)

_NO_STREAMS = (
    "durable streams (async requests with callbacks) need a real nats-server; "
    "the in-memory transport covers request/reply, fan-out, events and KV"
)

__all__ = ["MemoryBroker", "MemoryKeyValue", "MemoryMsg", "MemoryTransport", "subject_matches"]


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


class _MemoryWatch:
    def __init__(self, kv: MemoryKeyValue) -> None:
        self._kv = kv
        self.queue: asyncio.Queue[KVEvent | _Stop | None] = asyncio.Queue()

    def __aiter__(self) -> _MemoryWatch:
        return self

    async def __anext__(self) -> KVEvent | None:
        item = await self.queue.get()
        if isinstance(item, _Stop):
            raise StopAsyncIteration
        return item

    async def stop(self) -> None:
        self._kv.watchers.discard(self)
        self.queue.put_nowait(_Stop())


class _Stop:
    pass


class MemoryKeyValue:
    """Values with write time, revision and optional per-key expiry; watchers notified."""

    def __init__(self, ttl: float, clock: Callable[[], float]) -> None:
        self._ttl, self._clock = ttl, clock
        self._data: dict[str, tuple[float, bytes, int, float | None]] = {}
        self._rev = itertools.count(1)
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self.watchers: set[_MemoryWatch] = set()

    def _live(self, key: str) -> bytes | None:
        item = self._data.get(key)
        if item is None:
            return None
        written, value, _, expires = item
        now = self._clock()
        if (self._ttl and written + self._ttl <= now) or (expires is not None and expires <= now):
            self._remove(key)
            return None
        return value

    def _remove(self, key: str) -> None:
        if self._data.pop(key, None) is not None:
            self._notify(KVEvent(key, None, next(self._rev)))
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    def _notify(self, event: KVEvent) -> None:
        for watcher in self.watchers:
            watcher.queue.put_nowait(event)

    def _store(self, key: str, value: bytes, ttl: float | None) -> None:
        now = self._clock()
        rev = next(self._rev)
        self._data[key] = (now, value, rev, None if ttl is None else now + ttl)
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        if ttl is not None:
            # the real server places a delete marker when a per-key TTL lapses
            self._timers[key] = asyncio.get_running_loop().call_later(ttl, self._live, key)
        self._notify(KVEvent(key, value, rev))

    async def create(self, key: str, value: bytes) -> bool:
        if self._live(key) is not None:
            return False
        self._store(key, value, None)
        return True

    async def get(self, key: str) -> bytes | None:
        return self._live(key)

    async def put(self, key: str, value: bytes, *, ttl: float | None = None) -> None:
        self._store(key, value, ttl)

    async def delete(self, key: str) -> None:
        self._remove(key)

    async def entry(self, key: str) -> tuple[bytes, int] | None:
        value = self._live(key)
        return None if value is None else (value, self._data[key][2])

    async def update(self, key: str, value: bytes, revision: int) -> bool:
        current = await self.entry(key)
        if current is None or current[1] != revision:
            return False
        self._store(key, value, None)
        return True

    async def delete_if(self, key: str, revision: int) -> bool:
        current = await self.entry(key)
        if current is None or current[1] != revision:
            return False
        self._remove(key)
        return True

    async def watch(self) -> KeyWatch:
        watcher = _MemoryWatch(self)
        for key in list(self._data):
            value = self._live(key)
            if value is not None:
                watcher.queue.put_nowait(KVEvent(key, value, self._data[key][2]))
        watcher.queue.put_nowait(None)
        self.watchers.add(watcher)
        return watcher


class MemoryBroker:
    """The shared in-process 'server'. ``clock`` drives KV expiry (inject it in tests)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.subs: set[_MemorySub] = set()
        self.buckets: dict[str, MemoryKeyValue] = {}
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

    async def key_value(
        self,
        bucket: str,
        *,
        ttl: float = 0,
        storage: Storage = "memory",
        replicas: int = 1,
        expiry_events: bool = False,
    ) -> KeyValue:
        self._check_open()
        return self.broker.buckets.setdefault(bucket, MemoryKeyValue(ttl, self.broker.clock))

    def on_reconnect(self, callback: Callable[[], Awaitable[None]]) -> None:
        """An in-memory connection never drops; nothing to register."""

    async def ensure_stream(
        self, name: str, subjects: list[str], *, replicas: int = 1, max_age: float = 0
    ) -> None:
        raise TransportError(_NO_STREAMS)

    async def publish_durable(
        self, subject: str, data: bytes, *, msg_id: str, timeout: float = 5.0
    ) -> int:
        raise TransportError(_NO_STREAMS)

    async def pull_consumer(
        self,
        stream: str,
        durable: str,
        filter_subject: str,
        *,
        ack_wait: float = 30.0,
        max_deliver: int = 10,
    ) -> PullConsumer:
        raise TransportError(_NO_STREAMS)

    async def flush(self, timeout: float = 5.0) -> None:
        self._check_open()
        await asyncio.sleep(0)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for sub in self._subs:
            await sub.unsubscribe()
