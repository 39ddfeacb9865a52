"""Sealing (sign) and verifying envelopes: the rules every receiver applies.

Verification runs in a fixed order and stops at the first failure, whose code the
:class:`~bus.errors.EnvelopeRejected` carries (docs/ENVELOPE.md §Verification):

1. ``malformed`` / ``unsupported_version``: the body does not decode;
2. ``unknown_signer``: the key id is not in the trust store;
3. ``sender_mismatch``: the key is bound to another agent than ``sender.agent_id``;
4. ``bad_signature``: the signature does not verify over the canonical bytes;
5. ``wrong_kind``: e.g. a reply delivered where requests are served;
6. ``expired`` / ``not_yet_valid`` / ``lifetime_exceeded``: the time window;
7. ``not_recipient``: addressed to another agent.

The replay check comes last, outside this module (it may need I/O), so that only
authentic envelopes ever enter the seen-ids store. Pure: time is passed in.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import orjson

from .envelope import (
    Envelope,
    ErrorInfo,
    Kind,
    Party,
    Signature,
    TraceContext,
    canonical_bytes,
    decode,
)
from .errors import EnvelopeRejected
from .ids import new_id
from .keys import ALGORITHM, KeyPair, b64url_decode, b64url_encode
from .trust import TrustStore

__all__ = ["Sealer", "VerificationPolicy", "Verifier", "new_id"]


class Sealer:
    """Builds and signs envelopes as one agent.

    Args:
        key: the agent's key pair; its agent id becomes ``sender.agent_id``.
        framework: the sender's framework name (``sender.framework``).
    """

    def __init__(self, key: KeyPair, framework: str = "intentbus") -> None:
        self.key = key
        self.party = Party(key.agent_id, framework)
        self._sign = key.signer()
        self._kid = key.kid

    def seal(
        self,
        *,
        kind: Kind,
        intent: str,
        payload: Any,
        correlation_id: str,
        trace: TraceContext,
        created_at: int,
        expires_at: int,
        recipient: Party | None = None,
        reply_to: str | None = None,
        in_reply_to: str | None = None,
        error: ErrorInfo | None = None,
        message_id: str | None = None,
        audience: tuple[str, ...] | None = None,
        idempotency_key: str | None = None,
        status: str | None = None,
    ) -> tuple[Envelope, bytes]:
        """Build, canonicalize, sign and encode an envelope.

        Returns:
            The sealed envelope and its wire bytes.

        Raises:
            TypeError, ValueError: ``payload`` is not canonicalizable JSON.
        """
        if kind == "reply" and status is None:
            status = "error" if error is not None else "ok"
        env = Envelope(
            kind=kind,
            message_id=message_id or new_id(),
            correlation_id=correlation_id,
            trace=trace,
            sender=self.party,
            intent=intent,
            payload=payload,
            created_at=created_at,
            expires_at=expires_at,
            recipient=recipient,
            reply_to=reply_to,
            in_reply_to=in_reply_to,
            status=status,
            error=error,
            audience=audience,
            idempotency_key=idempotency_key,
        )
        body = env.unsigned_dict()
        sig = Signature(ALGORITHM, self._kid, b64url_encode(self._sign(canonical_bytes(body))))
        body["signature"] = sig.to_dict()
        env.signature = sig
        return env, orjson.dumps(body)


@dataclass(frozen=True, slots=True)
class VerificationPolicy:
    """Tunable limits of the verification rules.

    Attributes:
        skew_ms: clock-skew allowance on both edges of the window (default 30 s).
        max_lifetime_ms: the longest ``expires_at - created_at`` accepted (default 10 min);
            it bounds how long seen ids must be remembered.
    """

    skew_ms: int = 30_000
    max_lifetime_ms: int = 600_000

    @property
    def replay_window_ms(self) -> int:
        """How long a seen message id must be remembered to refuse every replay."""
        return self.max_lifetime_ms + 2 * self.skew_ms


class Verifier:
    """Applies the verification rules for one receiving agent.

    Args:
        trust: the keys whose signatures are accepted.
        agent_id: this receiver; envelopes addressed to another agent are refused.
        policy: time limits.
    """

    def __init__(
        self, trust: TrustStore, agent_id: str, policy: VerificationPolicy | None = None
    ) -> None:
        self.trust = trust
        self.agent_id = agent_id
        self.policy = policy or VerificationPolicy()

    def verify(self, body: bytes, now_ms: int, kinds: Collection[str]) -> Envelope:
        """Decode and check ``body``; return the envelope or raise EnvelopeRejected."""
        env, unsigned = decode(body)
        try:
            self._check_signature(env, unsigned)
            self._check_rest(env, now_ms, kinds)
        except EnvelopeRejected as exc:
            exc.message_id = env.message_id
            raise
        return env

    def _check_signature(self, env: Envelope, unsigned: dict[str, Any]) -> None:
        sig = env.signature
        if sig is None:
            raise EnvelopeRejected("bad_signature", "envelope is not signed")
        key = self.trust.get(sig.kid)
        if key is None:
            raise EnvelopeRejected("unknown_signer", f"key {sig.kid!r} is not trusted")
        if key.agent_id != env.sender.agent_id:
            raise EnvelopeRejected(
                "sender_mismatch",
                f"key {sig.kid!r} belongs to {key.agent_id!r}, not {env.sender.agent_id!r}",
            )
        if sig.alg != ALGORITHM:
            raise EnvelopeRejected("bad_signature", f"algorithm {sig.alg!r} is not {ALGORITHM}")
        try:
            raw_sig = b64url_decode(sig.sig)
        except ValueError:
            raise EnvelopeRejected("bad_signature", "signature is not base64url") from None
        try:
            canonical = canonical_bytes(unsigned)
        except (TypeError, ValueError) as exc:
            raise EnvelopeRejected("malformed", f"no canonical form: {exc}") from None
        if not key.verify(canonical, raw_sig):
            raise EnvelopeRejected("bad_signature", "signature does not verify")

    def _check_rest(self, env: Envelope, now_ms: int, kinds: Collection[str]) -> None:
        if env.kind not in kinds:
            raise EnvelopeRejected("wrong_kind", f"a {env.kind} is not accepted here")
        skew = self.policy.skew_ms
        if now_ms > env.expires_at + skew:
            raise EnvelopeRejected("expired", f"expired {now_ms - env.expires_at} ms ago")
        if env.created_at > now_ms + skew:
            raise EnvelopeRejected(
                "not_yet_valid", f"created {env.created_at - now_ms} ms in the future"
            )
        if env.expires_at - env.created_at > self.policy.max_lifetime_ms:
            raise EnvelopeRejected(
                "lifetime_exceeded",
                f"lifetime {env.expires_at - env.created_at} ms exceeds "
                f"{self.policy.max_lifetime_ms} ms",
            )
        if env.recipient is not None and env.recipient.agent_id != self.agent_id:
            raise EnvelopeRejected(
                "not_recipient", f"addressed to {env.recipient.agent_id!r}, not {self.agent_id!r}"
            )
        if env.audience is not None and self.agent_id not in env.audience:
            raise EnvelopeRejected("not_recipient", f"{self.agent_id!r} is not in the audience")
