"""The error tree of intentbus: one root, branches named by who is at fault.

::

    BusError
    ├── UsageError                 you: a bad argument or a call in the wrong state
    │   ├── InvalidIntentError     an intent outside the grammar (also ValueError)
    │   ├── InvalidKeyError        a key or key file that cannot be used (also ValueError)
    │   ├── InvalidSelectorError   a label selector outside the grammar (also ValueError)
    │   └── BusClosedError         the bus was closed; it cannot be reopened
    ├── TransportError             the link: the NATS connection broke or refused
    │   └── ServerStartError       the embedded nats-server is missing or did not start
    ├── EnvelopeRejected           a bad or unsigned envelope (``code`` says which rule)
    │   └── ReplyRejected          no acceptable reply arrived; the ones that did were refused
    ├── RemoteError                the remote said no, in a signed error reply
    │   ├── RequestRefused         the remote refused our envelope (signature, expiry ...)
    │   ├── NoHandlerError         the remote serves no handler for that intent
    │   └── HandlerFailed          the remote handler raised, or returned an application error
    ├── NoRespondersError          nobody is subscribed to that intent or agent right now
    ├── NoExecutorError            the registry knows no live executor matching intent+selector
    └── DeadlineExceeded           the deadline passed before a reply (also TimeoutError)

Errors carry structured fields (``code``, ``subject``, ``sender``...) rather than
meaning hidden in the message. Transport codes (JSON-RPC codes, HTTP statuses) do not
live here: the edge that speaks a protocol owns its own table.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BUS_CODES",
    "REFUSAL_CODES",
    "BusClosedError",
    "BusError",
    "DeadlineExceeded",
    "EnvelopeRejected",
    "HandlerFailed",
    "InvalidIntentError",
    "InvalidKeyError",
    "InvalidSelectorError",
    "NoExecutorError",
    "NoHandlerError",
    "NoRespondersError",
    "RemoteError",
    "ReplyRejected",
    "RequestRefused",
    "ServerStartError",
    "TransportError",
    "UsageError",
    "remote_error",
]

#: Codes a receiver uses when it refuses an envelope before any handler runs.
REFUSAL_CODES = frozenset(
    {
        "malformed",
        "unsupported_version",
        "unknown_signer",
        "sender_mismatch",
        "bad_signature",
        "expired",
        "not_yet_valid",
        "lifetime_exceeded",
        "replayed",
        "not_recipient",
        "wrong_kind",
    }
)

#: Every code the bus itself puts in error replies; handlers choose other codes.
BUS_CODES = REFUSAL_CODES | {"no_handler", "handler_error", "upstream_error", "deadline_exceeded"}


class BusError(Exception):
    """Root of every error intentbus raises on purpose."""


class UsageError(BusError):
    """The caller used the API wrongly; fix the call, retrying will not help."""


class InvalidIntentError(UsageError, ValueError):
    """An intent (or agent id) is outside the grammar; ``position`` points at the fault."""

    def __init__(self, message: str, *, value: str, position: int | None = None) -> None:
        super().__init__(message)
        self.value = value
        self.position = position


class InvalidKeyError(UsageError, ValueError):
    """A key, public key string or key file cannot be used."""


class InvalidSelectorError(UsageError, ValueError):
    """A label selector cannot be parsed; ``position`` is the offending character."""

    def __init__(self, message: str, *, selector: str, position: int) -> None:
        pointer = f"\n  {selector}\n  {' ' * position}^"
        super().__init__(f"{message} at position {position}{pointer}")
        self.selector = selector
        self.position = position


class BusClosedError(UsageError):
    """The bus was closed. A closed bus cannot be reopened; connect a new one."""


class TransportError(BusError):
    """The link to NATS failed: connection refused, lost, or a server-side error."""


class ServerStartError(TransportError):
    """The embedded nats-server binary is missing or did not become ready."""


class EnvelopeRejected(BusError):
    """An envelope failed verification. ``code`` is one of :data:`REFUSAL_CODES`.

    Raised by the pure verification rules; the bus turns it into a signed error
    reply on the receiving side, so the handler is never called.
    """

    def __init__(self, code: str, message: str, *, message_id: str | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.detail = message
        self.message_id = message_id


class ReplyRejected(EnvelopeRejected):
    """Replies arrived but none was acceptable (forged, untrusted, not for us)."""


class RemoteError(BusError):
    """A signed error reply from the remote. ``code`` is machine-readable."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        sender: str = "",
        data: Any = None,
        correlation_id: str = "",
    ) -> None:
        super().__init__(f"{code}: {message}" + (f" (from {sender})" if sender else ""))
        self.code = code
        self.detail = message
        self.sender = sender
        self.data = data
        self.correlation_id = correlation_id


class RequestRefused(RemoteError):
    """The remote refused our envelope before running any handler."""


class NoHandlerError(RemoteError):
    """The remote agent serves no handler for the requested intent."""


class HandlerFailed(RemoteError):
    """The remote handler raised, or returned an application error code."""


class NoRespondersError(BusError):
    """Nobody was subscribed to the subject: distinct from a timeout."""

    def __init__(self, subject: str) -> None:
        super().__init__(f"no responders on {subject!r}")
        self.subject = subject


class NoExecutorError(BusError):
    """No live, trusted executor of ``intent`` matches ``selector`` (not a timeout)."""

    def __init__(self, intent: str, selector: str) -> None:
        where = f" matching {selector!r}" if selector else ""
        super().__init__(f"no executor of {intent!r}{where} is registered and alive")
        self.intent = intent
        self.selector = selector


class DeadlineExceeded(BusError, TimeoutError):
    """The deadline passed before an acceptable reply arrived."""

    def __init__(self, subject: str, timeout: float, detail: str = "") -> None:
        super().__init__(detail or f"no reply on {subject!r} within {timeout:.3f}s")
        self.subject = subject
        self.timeout = timeout


def remote_error(
    code: str, message: str, *, sender: str = "", data: Any = None, correlation_id: str = ""
) -> RemoteError:
    """Build the right :class:`RemoteError` subclass for an error reply's ``code``."""
    cls: type[RemoteError]
    if code in REFUSAL_CODES:
        cls = RequestRefused
    elif code == "no_handler":
        cls = NoHandlerError
    else:
        cls = HandlerFailed
    return cls(code, message, sender=sender, data=data, correlation_id=correlation_id)
