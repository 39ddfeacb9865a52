"""intentbus core: signed envelopes routed by intent over NATS.

Map of the package, bottom to top (arrows point down only):

* pure core, no I/O: :mod:`~bus.canonical` (RFC 8785), :mod:`~bus.envelope`,
  :mod:`~bus.keys`, :mod:`~bus.trust`, :mod:`~bus.signing` (seal and verification
  rules), :mod:`~bus.subjects` (intent grammar, subject scheme), :mod:`~bus.errors`;
* the transport seam: :mod:`bus.transport` (nats-py adapter, in-memory twin) and the
  embedded server launcher :mod:`~bus.server`;
* the bus: :class:`Bus` with its reply :mod:`~bus.inbox`, receive pipeline
  (:mod:`~bus.receive`), replay guards (:mod:`~bus.replay`) and handler
  :class:`Context`.
"""

from .bus import Bus, BusState, ReplayMode
from .callbacks import CallbackPolicy
from .canonical import canonicalize
from .context import Context, HandlerError, PendingReview, Review
from .directory import Directory
from .durable import DurableConfig, Results
from .envelope import Envelope, ErrorInfo, Party, TraceContext
from .errors import (
    BusClosedError,
    BusError,
    DeadlineExceeded,
    EnvelopeRejected,
    HandlerFailed,
    InvalidIntentError,
    InvalidKeyError,
    InvalidSelectorError,
    NoExecutorError,
    NoHandlerError,
    NoRespondersError,
    RemoteError,
    ReplyRejected,
    RequestRefused,
    ServerStartError,
    TransportError,
    UsageError,
)
from .fanout import FanOutReply, FanOutResult, Policy
from .keyfile import load_key, load_trust_file, write_key_pair
from .keys import KeyPair, PublicKey
from .retry import RetryPolicy
from .server import EmbeddedServer, find_nats_server
from .signing import Sealer, VerificationPolicy, Verifier
from .subjects import SubjectScheme
from .trust import TrustStore

__all__ = [
    "Bus",
    "BusClosedError",
    "BusError",
    "BusState",
    "CallbackPolicy",
    "Context",
    "DeadlineExceeded",
    "Directory",
    "DurableConfig",
    "EmbeddedServer",
    "Envelope",
    "EnvelopeRejected",
    "ErrorInfo",
    "FanOutReply",
    "FanOutResult",
    "HandlerError",
    "HandlerFailed",
    "InvalidIntentError",
    "InvalidKeyError",
    "InvalidSelectorError",
    "KeyPair",
    "NoExecutorError",
    "NoHandlerError",
    "NoRespondersError",
    "Party",
    "PendingReview",
    "Policy",
    "PublicKey",
    "RemoteError",
    "ReplayMode",
    "ReplyRejected",
    "RequestRefused",
    "Results",
    "RetryPolicy",
    "Review",
    "Sealer",
    "ServerStartError",
    "SubjectScheme",
    "TraceContext",
    "TransportError",
    "TrustStore",
    "UsageError",
    "VerificationPolicy",
    "Verifier",
    "canonicalize",
    "find_nats_server",
    "load_key",
    "load_trust_file",
    "write_key_pair",
]
