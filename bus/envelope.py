"""The signed envelope: the typed model, its JSON form, and strict decoding.

The wire form is a JSON object (docs/ENVELOPE.md §Body). Absent optional members are
omitted, never sent as ``null``; a ``null`` is read as absent. Unknown members are
kept in the signed bytes (so a newer sender's fields stay covered) and otherwise
ignored. Pure: no I/O, no clock.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from .errors import EnvelopeRejected
from .subjects import validate_agent_id, validate_intent

__all__ = [
    "ENVELOPE_VERSION",
    "Envelope",
    "ErrorInfo",
    "Party",
    "Signature",
    "TraceContext",
    "decode",
]

ENVELOPE_VERSION = 1
A2A_VERSION = "1.0"
Kind = Literal["request", "reply", "event"]
KINDS = ("request", "reply", "event")
STATUSES = ("ok", "error")
_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_CODE = re.compile(r"[a-z][a-z0-9_.]{0,63}")


@dataclass(frozen=True, slots=True)
class Party:
    """A sender or recipient: the agent id and the framework it runs on."""

    agent_id: str
    framework: str = ""

    def to_dict(self) -> dict[str, str]:
        """JSON form."""
        return {"agent_id": self.agent_id, "framework": self.framework}


@dataclass(frozen=True, slots=True)
class TraceContext:
    """W3C trace context: ``traceparent`` (version 00) and optional ``tracestate``."""

    trace_id: str
    span_id: str
    flags: str = "01"
    tracestate: str = ""

    @property
    def traceparent(self) -> str:
        """The ``traceparent`` header value."""
        return f"00-{self.trace_id}-{self.span_id}-{self.flags}"

    @classmethod
    def parse(cls, traceparent: str, tracestate: str = "") -> TraceContext:
        """Parse a version-00 ``traceparent``; raise ValueError when invalid."""
        m = _TRACEPARENT.fullmatch(traceparent) if isinstance(traceparent, str) else None
        if m is None or m[1] == "0" * 32 or m[2] == "0" * 16:
            raise ValueError(f"invalid traceparent {traceparent!r}")
        return cls(m[1], m[2], m[3], tracestate)

    def to_dict(self) -> dict[str, str]:
        """JSON form; ``tracestate`` omitted when empty."""
        d = {"traceparent": self.traceparent}
        if self.tracestate:
            d["tracestate"] = self.tracestate
        return d


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """The error of an error reply: machine-readable ``code``, human ``message``."""

    code: str
    message: str
    data: Any = None

    def to_dict(self) -> dict[str, Any]:
        """JSON form; ``data`` omitted when None."""
        d: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            d["data"] = self.data
        return d


@dataclass(frozen=True, slots=True)
class Signature:
    """Algorithm, key id and the base64url signature value."""

    alg: str
    kid: str
    sig: str

    def to_dict(self) -> dict[str, str]:
        """JSON form."""
        return {"alg": self.alg, "kid": self.kid, "sig": self.sig}


@dataclass(frozen=True, slots=True)
class Envelope:
    """One message on the bus. Times are Unix milliseconds (UTC).

    ``in_reply_to``, ``status`` and ``error`` belong to replies; ``recipient`` and
    ``reply_to`` are optional. ``signature`` is None only before sealing.
    """

    kind: Kind
    message_id: str
    correlation_id: str
    trace: TraceContext
    sender: Party
    intent: str
    payload: Any
    created_at: int
    expires_at: int
    recipient: Party | None = None
    reply_to: str | None = None
    in_reply_to: str | None = None
    status: str | None = None
    error: ErrorInfo | None = None
    a2a_version: str = A2A_VERSION
    signature: Signature | None = None

    def unsigned_dict(self) -> dict[str, Any]:
        """The JSON object without ``signature``: what the signature covers."""
        d: dict[str, Any] = {
            "v": ENVELOPE_VERSION,
            "kind": self.kind,
            "message_id": self.message_id,
            "correlation_id": self.correlation_id,
            "trace": self.trace.to_dict(),
            "sender": self.sender.to_dict(),
            "intent": self.intent,
            "payload": self.payload,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "a2a_version": self.a2a_version,
        }
        if self.recipient is not None:
            d["recipient"] = self.recipient.to_dict()
        if self.reply_to is not None:
            d["reply_to"] = self.reply_to
        if self.in_reply_to is not None:
            d["in_reply_to"] = self.in_reply_to
        if self.status is not None:
            d["status"] = self.status
        if self.error is not None:
            d["error"] = self.error.to_dict()
        return d

    def to_dict(self) -> dict[str, Any]:
        """The full JSON object, signature included when present."""
        d = self.unsigned_dict()
        if self.signature is not None:
            d["signature"] = self.signature.to_dict()
        return d

    def to_bytes(self) -> bytes:
        """Wire bytes (not canonical: receivers re-canonicalize)."""
        return orjson.dumps(self.to_dict())


def decode(body: bytes) -> tuple[Envelope, dict[str, Any]]:
    """Parse and validate wire bytes.

    Returns:
        The envelope and the received JSON object without ``signature`` (the exact
        members the signature must cover, unknown ones included).

    Raises:
        EnvelopeRejected: code ``malformed`` or ``unsupported_version``.
    """
    try:
        raw = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise EnvelopeRejected("malformed", f"body is not JSON: {exc}") from None
    if type(raw) is not dict:
        raise EnvelopeRejected("malformed", "body is not a JSON object")
    mid = raw.get("message_id")
    mid = mid if isinstance(mid, str) and _ID.fullmatch(mid) else None
    try:
        return _build(raw), {k: v for k, v in raw.items() if k != "signature"}
    except EnvelopeRejected as exc:
        exc.message_id = mid
        raise
    except (ValueError, TypeError, KeyError) as exc:
        raise EnvelopeRejected("malformed", str(exc), message_id=mid) from None


def _build(raw: dict[str, Any]) -> Envelope:
    if raw.get("v") != ENVELOPE_VERSION:
        raise EnvelopeRejected("unsupported_version", f"envelope version {raw.get('v')!r}; want 1")
    kind = _str(raw, "kind")
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    status = _opt_str(raw, "status")
    if status is not None and status not in STATUSES:
        raise ValueError(f"status must be one of {STATUSES}, not {status!r}")
    error = _error(raw.get("error"))
    if (status == "error") != (error is not None):
        raise ValueError("status 'error' and the error member go together")
    created, expires = _int(raw, "created_at"), _int(raw, "expires_at")
    if expires < created:
        raise ValueError("expires_at is before created_at")
    if "payload" not in raw:
        raise ValueError("payload is missing")
    in_reply_to = _opt_id(raw, "in_reply_to")
    if (kind == "reply") != (in_reply_to is not None):
        raise ValueError("in_reply_to is required on replies and only there")
    return Envelope(
        kind=kind,  # type: ignore[arg-type]
        message_id=_id(raw, "message_id"),
        correlation_id=_id(raw, "correlation_id"),
        trace=_trace(raw.get("trace")),
        sender=_party(raw.get("sender"), "sender"),
        intent=validate_intent(_str(raw, "intent")),
        payload=raw["payload"],
        created_at=created,
        expires_at=expires,
        recipient=None if raw.get("recipient") is None else _party(raw["recipient"], "recipient"),
        reply_to=_opt_str(raw, "reply_to"),
        in_reply_to=in_reply_to,
        status=status,
        error=error,
        a2a_version=_str(raw, "a2a_version"),
        signature=_signature(raw.get("signature")),
    )


def _str(raw: dict[str, Any], key: str) -> str:
    v = raw.get(key)
    if not isinstance(v, str):
        raise ValueError(f"{key} must be a string")
    return v


def _opt_str(raw: dict[str, Any], key: str) -> str | None:
    return None if raw.get(key) is None else _str(raw, key)


def _id(raw: dict[str, Any], key: str) -> str:
    v = _str(raw, key)
    if _ID.fullmatch(v) is None:
        raise ValueError(f"{key} must be 1-128 characters of A-Z a-z 0-9 _ -")
    return v


def _opt_id(raw: dict[str, Any], key: str) -> str | None:
    return None if raw.get(key) is None else _id(raw, key)


def _int(raw: dict[str, Any], key: str) -> int:
    v = raw.get(key)
    if type(v) is not int or v < 0:
        raise ValueError(f"{key} must be a non-negative integer (Unix milliseconds)")
    return v


def _obj(value: Any, what: str) -> dict[str, Any]:
    if type(value) is not dict:
        raise ValueError(f"{what} must be an object")
    return value


def _party(value: Any, what: str) -> Party:
    d = _obj(value, what)
    framework = d.get("framework", "")
    if not isinstance(framework, str):
        raise ValueError(f"{what}.framework must be a string")
    return Party(validate_agent_id(_str(d, "agent_id")), framework)


def _trace(value: Any) -> TraceContext:
    d = _obj(value, "trace")
    state = d.get("tracestate") or ""
    if not isinstance(state, str):
        raise ValueError("trace.tracestate must be a string")
    return TraceContext.parse(_str(d, "traceparent"), state)


def _error(value: Any) -> ErrorInfo | None:
    if value is None:
        return None
    d = _obj(value, "error")
    code = _str(d, "code")
    if _CODE.fullmatch(code) is None:
        raise ValueError(f"error.code {code!r} must match [a-z][a-z0-9_.]*")
    return ErrorInfo(code, _str(d, "message"), d.get("data"))


def _signature(value: Any) -> Signature | None:
    if value is None:
        return None
    d = _obj(value, "signature")
    return Signature(_str(d, "alg"), _str(d, "kid"), _str(d, "sig"))
