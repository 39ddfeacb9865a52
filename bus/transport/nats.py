"""The nats-py adapter of the transport seam.

It is the only module that imports nats-py (apart from the test fixtures), so a
move to the newer nats-core client is a change to this one file.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig, KeyValueConfig, StorageType, StreamConfig

from ..errors import TransportError
from .base import (
    JsMsg,
    KeyValue,
    KeyWatch,
    KVEvent,
    MsgHandler,
    PullConsumer,
    Storage,
    Subscription,
)

__all__ = ["NatsTransport", "connect"]

log = logging.getLogger("intentbus.transport")

#: Per-subscription buffer before nats-py reports a slow consumer and drops.
PENDING_MSGS = 65_536
#: Seconds ``close`` lets subscriptions drain before it closes anyway (nats-py: 30).
DRAIN_TIMEOUT = 5
#: How long the server keeps the delete marker it places when a key's TTL lapses.
MARKER_TTL = 60.0


async def connect(url: str, *, name: str = "intentbus", reconnect: bool = True) -> NatsTransport:
    """Connect to ``url`` (comma-separated for a cluster).

    Args:
        url: ``nats://host:port`` list.
        name: connection name shown by the server's monitoring.
        reconnect: keep reconnecting forever after a loss (production default).

    Raises:
        TransportError: the server cannot be reached.
    """

    async def on_error(exc: Exception) -> None:
        log.warning("nats error on %s: %s", url, exc)

    transport: NatsTransport | None = None

    async def on_reconnect() -> None:
        if transport is not None:
            await transport._reconnected()

    try:
        nc = await nats.connect(
            servers=url.split(","),
            name=name,
            allow_reconnect=reconnect,
            max_reconnect_attempts=-1 if reconnect else 0,
            reconnect_time_wait=0.5,
            connect_timeout=5,
            error_cb=on_error,
            reconnected_cb=on_reconnect,
            drain_timeout=DRAIN_TIMEOUT,
        )
    except (OSError, nats.errors.Error) as exc:
        raise TransportError(f"cannot connect to NATS at {url}: {exc}") from exc
    transport = NatsTransport(nc, url)
    return transport


class _Watch:
    def __init__(self, watcher: Any) -> None:
        self._watcher = watcher

    def __aiter__(self) -> _Watch:
        return self

    async def __anext__(self) -> KVEvent | None:
        entry = await self._watcher.__anext__()
        if entry is None:
            return None
        deleted = entry.operation in ("DEL", "PURGE")
        return KVEvent(entry.key, None if deleted else entry.value, entry.revision)

    async def stop(self) -> None:
        with contextlib.suppress(nats.errors.Error):
            await self._watcher.stop()


class _Bucket:
    def __init__(self, kv: Any, js: Any, bucket: str) -> None:
        self._kv = kv
        self._js = js
        self._prefix = f"$KV.{bucket}."

    async def create(self, key: str, value: bytes) -> bool:
        try:
            await self._kv.create(key, value)
        except nats.js.errors.KeyWrongLastSequenceError:
            return False
        except nats.errors.Error as exc:
            raise TransportError(f"kv create {key!r}: {exc}") from exc
        return True

    async def get(self, key: str) -> bytes | None:
        found = await self.entry(key)
        return None if found is None else found[0]

    async def put(self, key: str, value: bytes, *, ttl: float | None = None) -> None:
        try:
            if ttl is None:
                await self._kv.put(key, value)
            else:  # a per-message TTL; the server places a delete marker when it lapses
                await self._js.publish(self._prefix + key, value, msg_ttl=ttl)
        except nats.errors.Error as exc:
            raise TransportError(f"kv put {key!r}: {exc}") from exc

    async def delete(self, key: str) -> None:
        try:
            await self._kv.delete(key)
        except nats.errors.Error as exc:
            raise TransportError(f"kv delete {key!r}: {exc}") from exc

    async def entry(self, key: str) -> tuple[bytes, int] | None:
        try:
            found = await self._kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            return None
        except nats.errors.Error as exc:
            raise TransportError(f"kv get {key!r}: {exc}") from exc
        return (found.value or b""), int(found.revision)

    async def update(self, key: str, value: bytes, revision: int) -> bool:
        try:
            await self._kv.update(key, value, last=revision)
        except nats.js.errors.KeyWrongLastSequenceError:
            return False
        except nats.errors.Error as exc:
            raise TransportError(f"kv update {key!r}: {exc}") from exc
        return True

    async def delete_if(self, key: str, revision: int) -> bool:
        try:
            await self._kv.delete(key, last=revision)
        except nats.js.errors.KeyWrongLastSequenceError:
            return False
        except nats.errors.Error as exc:
            raise TransportError(f"kv delete {key!r}: {exc}") from exc
        return True

    async def watch(self) -> KeyWatch:
        try:
            return _Watch(await self._kv.watchall())
        except nats.errors.Error as exc:
            raise TransportError(f"kv watch: {exc}") from exc


class _Sub:
    def __init__(self, sub: Any) -> None:
        self._sub = sub

    async def unsubscribe(self) -> None:
        try:
            await self._sub.unsubscribe()
        except nats.errors.Error as exc:
            raise TransportError(f"unsubscribe: {exc}") from exc


async def _wrapped(op: Awaitable[None], what: str) -> None:
    try:
        await op
    except nats.errors.Error as exc:
        raise TransportError(f"{what}: {exc}") from exc


class _JsMsg:
    __slots__ = ("_msg",)

    def __init__(self, msg: Any) -> None:
        self._msg = msg

    @property
    def subject(self) -> str:
        subject: str = self._msg.subject
        return subject

    @property
    def data(self) -> bytes:
        data: bytes = self._msg.data
        return data

    @property
    def deliveries(self) -> int:
        return int(self._msg.metadata.num_delivered)

    async def ack(self) -> None:
        await _wrapped(self._msg.ack(), "ack")

    async def nak(self, delay: float | None = None) -> None:
        await _wrapped(self._msg.nak(delay=delay), "nak")

    async def in_progress(self) -> None:
        await _wrapped(self._msg.in_progress(), "in_progress")

    async def term(self) -> None:
        await _wrapped(self._msg.term(), "term")


class _Pull:
    def __init__(self, sub: Any) -> None:
        self._sub = sub

    async def fetch(self, batch: int, timeout: float) -> list[JsMsg]:
        try:
            msgs = await self._sub.fetch(batch, timeout=timeout)
        except nats.errors.TimeoutError:
            return []
        except nats.errors.Error as exc:
            raise TransportError(f"fetch: {exc}") from exc
        return [_JsMsg(m) for m in msgs]

    async def close(self) -> None:
        with contextlib.suppress(nats.errors.Error):
            await self._sub.unsubscribe()


class NatsTransport:
    """A live nats-py connection; see :class:`bus.transport.base.Transport`."""

    def __init__(self, nc: Client, url: str) -> None:
        self.nc = nc
        self._url = url
        self._js = nc.jetstream()
        self._reconnect_callbacks: list[Callable[[], Awaitable[None]]] = []

    @property
    def url(self) -> str:
        return self._url

    def new_inbox(self) -> str:
        inbox: str = self.nc.new_inbox()
        return inbox

    async def publish(
        self,
        subject: str,
        data: bytes,
        *,
        reply: str = "",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        try:
            await self.nc.publish(
                subject, data, reply=reply, headers=dict(headers) if headers else None
            )
        except nats.errors.Error as exc:
            raise TransportError(f"publish to {subject!r}: {exc}") from exc

    async def subscribe(
        self, subject: str, handler: MsgHandler, *, queue: str = ""
    ) -> Subscription:
        try:
            sub = await self.nc.subscribe(
                subject, queue=queue, cb=handler, pending_msgs_limit=PENDING_MSGS
            )
            await self._sync()
        except nats.errors.Error as exc:
            raise TransportError(f"subscribe to {subject!r}: {exc}") from exc
        return _Sub(sub)

    async def key_value(
        self,
        bucket: str,
        *,
        ttl: float = 0,
        storage: Storage = "memory",
        replicas: int = 1,
        expiry_events: bool = False,
    ) -> KeyValue:
        config = KeyValueConfig(
            bucket=bucket,
            ttl=ttl or None,
            history=1,
            replicas=replicas,
            storage=StorageType.MEMORY if storage == "memory" else StorageType.FILE,
            limit_marker_ttl=MARKER_TTL if expiry_events else None,
        )
        try:
            try:
                kv = await self._js.key_value(bucket)
            except nats.js.errors.BucketNotFoundError:
                kv = await self._js.create_key_value(config)
        except nats.errors.Error as exc:
            raise TransportError(f"key-value bucket {bucket!r}: {exc}") from exc
        return _Bucket(kv, self._js, bucket)

    async def ensure_stream(
        self, name: str, subjects: list[str], *, replicas: int = 1, max_age: float = 0
    ) -> None:
        config = StreamConfig(
            name=name,
            subjects=subjects,
            num_replicas=replicas,
            storage=StorageType.FILE,
            max_age=max_age or None,
            duplicate_window=120.0,
        )
        try:
            try:
                await self._js.stream_info(name)
            except nats.js.errors.NotFoundError:
                await self._js.add_stream(config)
        except nats.errors.Error as exc:
            raise TransportError(f"stream {name!r}: {exc}") from exc

    async def publish_durable(
        self, subject: str, data: bytes, *, msg_id: str, timeout: float = 5.0
    ) -> int:
        try:
            ack = await self._js.publish(
                subject, data, timeout=timeout, headers={"Nats-Msg-Id": msg_id}
            )
        except nats.errors.Error as exc:
            raise TransportError(f"durable publish to {subject!r}: {exc}") from exc
        seq: int = ack.seq
        return seq

    async def pull_consumer(
        self,
        stream: str,
        durable: str,
        filter_subject: str,
        *,
        ack_wait: float = 30.0,
        max_deliver: int = 10,
    ) -> PullConsumer:
        config = ConsumerConfig(
            durable_name=durable,
            filter_subject=filter_subject,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=ack_wait,
            max_deliver=max_deliver,
        )
        try:
            sub = await self._js.pull_subscribe(
                filter_subject, durable=durable, stream=stream, config=config
            )
        except nats.errors.Error as exc:
            raise TransportError(f"consumer {durable!r} on {stream!r}: {exc}") from exc
        return _Pull(sub)

    def on_reconnect(self, callback: Callable[[], Awaitable[None]]) -> None:
        self._reconnect_callbacks.append(callback)

    async def _reconnected(self) -> None:
        log.info("reconnected to %s", self.nc.connected_url)
        for callback in list(self._reconnect_callbacks):
            try:
                await callback()
            except Exception:
                log.exception("reconnect callback failed")

    async def flush(self, timeout: float = 5.0) -> None:
        try:
            await self._sync(timeout)
        except nats.errors.Error as exc:
            raise TransportError(f"flush: {exc}") from exc

    async def _sync(self, timeout: float = 5.0) -> None:
        """Return once the server has processed every command sent before the call.

        nats-py 2.16 queues commands for its flusher task but writes ``flush()``'s PING
        straight to the socket, so one PONG can come back before a queued SUB was even
        sent (seen here: ~4% of subscribe+flush pairs, then a no-responders). By the
        time the first PONG arrives the flusher, runnable since before that PING, has
        written the queue; the second PONG therefore follows everything.
        """
        seconds = max(1, round(timeout))  # nats-py takes whole seconds
        await self.nc.flush(timeout=seconds)
        await self.nc.flush(timeout=seconds)

    async def close(self) -> None:
        if self.nc.is_closed:
            return
        try:
            await self.nc.drain()
        except nats.errors.Error as exc:
            log.warning("drain failed, closing: %s", exc)
            await self.nc.close()
