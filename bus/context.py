"""What a handler sees: the verified envelope, and calls that stay in its conversation.

While a handler runs, :data:`current_envelope` holds the envelope it serves. Any
request or event sent from inside it (through ``ctx`` or through the bus directly)
inherits the ``correlation_id``, the trace id (with a fresh span id) and the
deadline, so a conversation stays threaded with no effort from the author.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .envelope import Envelope, TraceContext
from .errors import UsageError
from .ids import new_span_id, new_trace_id

if TYPE_CHECKING:
    from .bus import Bus

__all__ = ["Context", "HandlerError", "PendingReview", "Review", "current_envelope", "new_trace"]

current_envelope: ContextVar[Envelope | None] = ContextVar("intentbus_envelope", default=None)


def new_trace(parent: TraceContext | None = None) -> TraceContext:
    """A child span of ``parent`` (same trace id, new span id), or a new trace."""
    if parent is None:
        return TraceContext(new_trace_id(), new_span_id(), "01")
    return TraceContext(parent.trace_id, new_span_id(), parent.flags, parent.tracestate)


class HandlerError(Exception):
    """Raise in a handler to send an error reply with your own code.

    Args:
        code: machine-readable, ``[a-z][a-z0-9_.]*`` (e.g. ``order.over_limit``).
        message: for humans.
        data: optional JSON detail.
    """

    def __init__(self, code: str, message: str, data: Any = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.data = data


class PendingReview(Exception):
    """Raise in an async (durable) handler when the request exceeds its autonomy.

    The request is parked, the requester is told (status ``pending_review``), and when
    a reviewer approves, the handler runs again with ``ctx.review.approved`` True; a
    decline sends the requester an error ``review.declined``.
    """

    def __init__(self, reason: str, data: Any = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.data = data


@dataclass(frozen=True, slots=True)
class Review:
    """A reviewer's decision on a parked request."""

    approved: bool
    by: str
    note: str = ""


class Context:
    """Per-request view handed to a handler as its second argument."""

    __slots__ = ("_progress", "bus", "envelope", "review")

    def __init__(
        self,
        bus: Bus,
        envelope: Envelope,
        review: Review | None = None,
        progress: Callable[[Any], Awaitable[None]] | None = None,
    ) -> None:
        self.bus = bus
        self.envelope = envelope
        #: Set when a parked request runs again after a reviewer's decision.
        self.review = review
        self._progress = progress

    async def progress(self, data: Any) -> None:
        """Tell the requester how an async request is going: a signed reply with status
        ``working`` and ``data`` as payload goes to its ``reply_to``. A no-op for
        request/reply, where the one reply is the result."""
        if self._progress is not None:
            await self._progress(data)

    @property
    def sender(self) -> str:
        """The verified sender's agent id."""
        return self.envelope.sender.agent_id

    @property
    def correlation_id(self) -> str:
        """The conversation this request belongs to."""
        return self.envelope.correlation_id

    @property
    def deadline_ms(self) -> int:
        """The request's absolute deadline, Unix milliseconds."""
        return self.envelope.expires_at

    async def request(
        self,
        intent: str,
        payload: Any,
        *,
        timeout: float | None = None,
        agent: str | None = None,
        selector: str | None = None,
        **options: Any,
    ) -> Envelope:
        """:meth:`Bus.request` within this conversation (see the module docstring);
        ``options`` are its other keywords (``call``, ``retry``, ``idempotency_key``)."""
        return await self.bus.request(
            intent,
            payload,
            timeout=timeout,
            agent=agent,
            selector=selector,
            parent=self.envelope,
            **options,
        )

    async def publish(self, intent: str, payload: Any) -> Envelope:
        """:meth:`Bus.publish` within this conversation."""
        return await self.bus.publish(intent, payload, parent=self.envelope)


def require_parent(parent: Envelope | None) -> Envelope | None:
    """The explicit parent, else the envelope of the running handler (if any)."""
    if parent is not None and not isinstance(parent, Envelope):
        raise UsageError("parent must be an Envelope")
    return parent if parent is not None else current_envelope.get()
