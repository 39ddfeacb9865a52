"""The one narrow seam between the bus and a message system.

Everything above this module (the Bus, the patterns, the registry, the agents) is
written against these Protocols only: a nats-py adapter (:mod:`bus.transport.nats`)
and an in-memory twin (:mod:`bus.transport.memory`) implement them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

__all__ = [
    "JsMsg",
    "KVEvent",
    "KeyValue",
    "KeyWatch",
    "Msg",
    "MsgHandler",
    "PullConsumer",
    "Subscription",
    "Transport",
    "is_no_responders",
]

Storage = Literal["memory", "file"]


class Msg(Protocol):
    """A received message (nats-py's ``Msg`` satisfies this as it is)."""

    @property
    def subject(self) -> str: ...
    @property
    def data(self) -> bytes: ...
    @property
    def reply(self) -> str: ...
    @property
    def headers(self) -> Mapping[str, str] | None: ...


MsgHandler = Callable[[Msg], Awaitable[None]]


def is_no_responders(msg: Msg) -> bool:
    """True for the server's status message that says nobody listens (status 503)."""
    headers = msg.headers
    return not msg.data and headers is not None and headers.get("Status") == "503"


class Subscription(Protocol):
    """A live subscription."""

    async def unsubscribe(self) -> None:
        """Stop delivery; messages already queued are dropped."""
        ...


@dataclass(frozen=True, slots=True)
class KVEvent:
    """A change seen by a watch: ``value`` None means deleted, purged or expired."""

    key: str
    value: bytes | None
    revision: int


class KeyWatch(Protocol):
    """Current values first, then ``None`` once (caught up), then every change."""

    def __aiter__(self) -> AsyncIterator[KVEvent | None]: ...

    async def __anext__(self) -> KVEvent | None: ...

    async def stop(self) -> None:
        """End the iteration."""
        ...


class KeyValue(Protocol):
    """A key/value bucket (JetStream KV, or its in-memory twin).

    A bucket TTL expires every key that long after its last write; a per-key ``ttl``
    on :meth:`put` does the same for one write, and watchers see the expiry as a
    deletion.
    """

    async def create(self, key: str, value: bytes) -> bool:
        """Store ``value`` only if ``key`` is absent; False when it exists (atomic)."""
        ...

    async def get(self, key: str) -> bytes | None:
        """The current value, or None when absent or expired."""
        ...

    async def put(self, key: str, value: bytes, *, ttl: float | None = None) -> None:
        """Store ``value`` unconditionally; with ``ttl`` it expires that many seconds later."""
        ...

    async def watch(self) -> KeyWatch:
        """Watch every key of the bucket."""
        ...

    async def delete(self, key: str) -> None:
        """Remove ``key`` (no error when absent)."""
        ...

    async def entry(self, key: str) -> tuple[bytes, int] | None:
        """The current value and its revision, or None when absent."""
        ...

    async def update(self, key: str, value: bytes, revision: int) -> bool:
        """Store ``value`` only if ``key`` is still at ``revision`` (compare-and-swap)."""
        ...

    async def delete_if(self, key: str, revision: int) -> bool:
        """Remove ``key`` only if it is still at ``revision``."""
        ...


class JsMsg(Protocol):
    """A message from a durable stream; it is redelivered until acknowledged."""

    @property
    def subject(self) -> str: ...
    @property
    def data(self) -> bytes: ...
    @property
    def deliveries(self) -> int:
        """How many times it was delivered (1 the first time)."""
        ...

    async def ack(self) -> None:
        """Done: never deliver it again."""
        ...

    async def nak(self, delay: float | None = None) -> None:
        """Not done: deliver it again (after ``delay`` seconds)."""
        ...

    async def in_progress(self) -> None:
        """Still working: restart the ack timer."""
        ...

    async def term(self) -> None:
        """Never deliver it again, without it being done (poison message)."""
        ...


class PullConsumer(Protocol):
    """A durable consumer shared by every process that pulls from it (a work queue)."""

    async def fetch(self, batch: int, timeout: float) -> list[JsMsg]:
        """Up to ``batch`` messages; an empty list when none came within ``timeout``."""
        ...

    async def close(self) -> None:
        """Stop pulling (the durable consumer stays on the server)."""
        ...


class Transport(Protocol):
    """Publish/subscribe with queue groups, inboxes and KV buckets.

    Contract: ``subscribe`` returns only once the subscription is live on the
    server (a publish made after it returns can be delivered to it); handlers of one
    subscription are awaited one at a time, in order, so a handler that must not
    block the subscription hands work to its own workers.
    """

    @property
    def url(self) -> str:
        """Where this transport is connected (for display)."""
        ...

    def new_inbox(self) -> str:
        """A fresh, unguessable subject prefix for replies to this connection."""
        ...

    async def publish(
        self,
        subject: str,
        data: bytes,
        *,
        reply: str = "",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """Send one message. With ``reply`` set and nobody subscribed to ``subject``,
        a no-responders status message is delivered to ``reply``."""
        ...

    async def subscribe(
        self, subject: str, handler: MsgHandler, *, queue: str = ""
    ) -> Subscription:
        """Deliver matching messages (``*`` and ``>`` wildcards) to ``handler``.

        Within one ``queue`` group each message reaches exactly one member.
        """
        ...

    async def key_value(
        self,
        bucket: str,
        *,
        ttl: float = 0,
        storage: Storage = "memory",
        replicas: int = 1,
        expiry_events: bool = False,
    ) -> KeyValue:
        """Open the bucket, creating it when missing.

        Args:
            ttl: bucket-wide expiry after each key's last write; 0 for none.
            storage: ``memory`` or ``file`` (survives a server restart).
            replicas: copies in a cluster (3 survives the loss of one node).
            expiry_events: watchers see per-key TTL expiries as deletions (the server
                places a delete marker); costs one marker message per expiry.
        """
        ...

    async def ensure_stream(
        self, name: str, subjects: list[str], *, replicas: int = 1, max_age: float = 0
    ) -> None:
        """Create the stream (file storage) unless it exists."""
        ...

    async def publish_durable(
        self, subject: str, data: bytes, *, msg_id: str, timeout: float = 5.0
    ) -> int:
        """Publish into a stream and wait for the server's ack; returns the sequence.

        ``msg_id`` deduplicates: publishing again with it (a retry after a lost ack)
        stores nothing new within the stream's duplicate window.
        """
        ...

    async def pull_consumer(
        self,
        stream: str,
        durable: str,
        filter_subject: str,
        *,
        ack_wait: float = 30.0,
        max_deliver: int = 10,
    ) -> PullConsumer:
        """Bind to (creating if needed) a durable pull consumer."""
        ...

    def on_reconnect(self, callback: Callable[[], Awaitable[None]]) -> None:
        """Call ``callback`` after the connection is re-established (watches resync)."""
        ...

    async def flush(self, timeout: float = 5.0) -> None:
        """Return once the server has processed everything sent so far."""
        ...

    async def close(self) -> None:
        """Drain subscriptions, flush and disconnect. Idempotent."""
        ...
