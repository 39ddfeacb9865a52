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

from .canonical import canonicalize, plain
from .errors import EnvelopeRejected
from .subjects import validate_agent_id, validate_intent

__all__ = [
    "ENVELOPE_VERSION",
    "Envelope",
    "ErrorInfo",
    "Party",
    "Signature",
    "TraceContext",
    "canonical_bytes",
    "decode",
]

ENVELOPE_VERSION = 1
A2A_VERSION = "1.0"
Kind = Literal["request", "reply", "event"]
KINDS = ("request", "reply", "event")
#: ``working`` and ``pending_review`` are interim replies of async requests.
STATUSES = ("ok", "error", "working", "pending_review")
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


@dataclass(slots=True)
class Envelope:
    """One message on the bus. Times are Unix milliseconds (UTC).

    ``in_reply_to``, ``status`` and ``error`` belong to replies; ``recipient`` and
    ``reply_to`` are optional. ``signature`` is None only before sealing. Treat it as
    immutable: it is not frozen only because frozen dataclasses cost ~3 µs more to
    build, twice per round trip.
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
    audience: tuple[str, ...] | None = None
    idempotency_key: str | None = None

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
        if self.audience is not None:
            d["audience"] = list(self.audience)
        if self.idempotency_key is not None:
            d["idempotency_key"] = self.idempotency_key
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
    try:
        env = _build(raw)
    except EnvelopeRejected as exc:
        exc.message_id = _safe_id(raw.get("message_id"))
        raise
    except (ValueError, TypeError, KeyError) as exc:
        raise EnvelopeRejected(
            "malformed", str(exc), message_id=_safe_id(raw.get("message_id"))
        ) from None
    unsigned = dict(raw)
    unsigned.pop("signature", None)
    return env, unsigned


def canonical_bytes(unsigned: dict[str, Any]) -> bytes:
    """RFC 8785 bytes of an envelope object without ``signature``.

    The members this module validates (ids, times, intent, the fixed-shape objects
    ``trace``, ``sender``, ``recipient``) hold only ASCII-keyed strings and safe
    integers, so only the rest (``payload``, ``error``, unknown members) needs the
    check that picks between orjson and the exact serializer.

    Raises:
        TypeError, ValueError: a value without a canonical JSON form.
    """
    for key in unsigned.keys() - _SHAPED:
        if not plain(unsigned[key]):
            return canonicalize(unsigned)
    return orjson.dumps(unsigned, option=orjson.OPT_SORT_KEYS)


_SHAPED = frozenset(
    {"v", "kind", "message_id", "correlation_id", "in_reply_to", "trace", "sender",
     "recipient", "intent", "reply_to", "status", "created_at", "expires_at", "a2a_version",
     "audience", "idempotency_key"}
)  # fmt: skip
_PARTY_KEYS = frozenset({"agent_id", "framework"})
_TRACE_KEYS = frozenset({"traceparent", "tracestate"})
_SIG_KEYS = frozenset({"alg", "kid", "sig"})
_MAX_MS = 2**53 - 1


def _safe_id(value: Any) -> str | None:
    return value if type(value) is str and _ID.fullmatch(value) else None


def _build(raw: dict[str, Any]) -> Envelope:
    get = raw.get
    if get("v") != ENVELOPE_VERSION:
        raise EnvelopeRejected("unsupported_version", f"envelope version {get('v')!r}; want 1")
    kind = get("kind")
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    created, expires = get("created_at"), get("expires_at")
    if (
        type(created) is not int
        or type(expires) is not int
        or not 0 <= created <= expires <= _MAX_MS
    ):
        raise ValueError("created_at <= expires_at must be integers (Unix milliseconds)")
    if "payload" not in raw:
        raise ValueError("payload is missing")
    status, error = get("status"), _error(get("error"))
    if status is not None and status not in STATUSES:
        raise ValueError(f"status must be one of {STATUSES}, not {status!r}")
    if (status == "error") != (error is not None):
        raise ValueError("status 'error' and the error member go together")
    in_reply_to = _opt_id(get("in_reply_to"), "in_reply_to")
    if (kind == "reply") != (in_reply_to is not None):
        raise ValueError("in_reply_to is required on replies and only there")
    recipient = get("recipient")
    reply_to = get("reply_to")
    if reply_to is not None and type(reply_to) is not str:
        raise ValueError("reply_to must be a string")
    a2a = get("a2a_version")
    if type(a2a) is not str:
        raise ValueError("a2a_version must be a string")
    intent = get("intent")
    if type(intent) is not str:
        raise ValueError("intent must be a string")
    return Envelope(
        kind,
        _id(get("message_id"), "message_id"),
        _id(get("correlation_id"), "correlation_id"),
        _trace(get("trace")),
        _party(get("sender"), "sender"),
        validate_intent(intent),
        raw["payload"],
        created,
        expires,
        None if recipient is None else _party(recipient, "recipient"),
        reply_to,
        in_reply_to,
        status,
        error,
        a2a,
        _signature(get("signature")),
        _audience(get("audience")),
        _opt_id(get("idempotency_key"), "idempotency_key"),
    )


MAX_AUDIENCE = 10_000


def _audience(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if type(value) is not list or len(value) > MAX_AUDIENCE:
        raise ValueError(f"audience must be a list of at most {MAX_AUDIENCE} agent ids")
    for agent_id in value:
        if type(agent_id) is not str:
            raise ValueError("audience holds agent ids (strings)")
        validate_agent_id(agent_id)
    return tuple(value)


def _id(value: Any, what: str) -> str:
    if type(value) is not str or _ID.fullmatch(value) is None:
        raise ValueError(f"{what} must be 1-128 characters of A-Z a-z 0-9 _ -")
    return value


def _opt_id(value: Any, what: str) -> str | None:
    return None if value is None else _id(value, what)


def _fields(value: Any, what: str, allowed: frozenset[str]) -> dict[str, Any]:
    if type(value) is not dict:
        raise ValueError(f"{what} must be an object")
    if not value.keys() <= allowed:
        raise ValueError(f"{what} has unknown members {sorted(value.keys() - allowed)}")
    for k, v in value.items():
        if type(v) is not str:
            raise ValueError(f"{what}.{k} must be a string")
    return value


def _party(value: Any, what: str) -> Party:
    d = _fields(value, what, _PARTY_KEYS)
    return Party(validate_agent_id(d.get("agent_id", "")), d.get("framework", ""))


def _trace(value: Any) -> TraceContext:
    d = _fields(value, "trace", _TRACE_KEYS)
    return TraceContext.parse(d.get("traceparent", ""), d.get("tracestate", ""))


def _error(value: Any) -> ErrorInfo | None:
    if value is None:
        return None
    if type(value) is not dict:
        raise ValueError("error must be an object")
    code, message = value.get("code"), value.get("message")
    if type(code) is not str or _CODE.fullmatch(code) is None:
        raise ValueError(f"error.code {code!r} must match [a-z][a-z0-9_.]*")
    if type(message) is not str:
        raise ValueError("error.message must be a string")
    return ErrorInfo(code, message, value.get("data"))


def _signature(value: Any) -> Signature | None:
    if value is None:
        return None
    d = _fields(value, "signature", _SIG_KEYS)
    if len(d) != 3:
        raise ValueError("signature needs alg, kid and sig")
    return Signature(d["alg"], d["kid"], d["sig"])
