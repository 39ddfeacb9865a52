"""intentbus registry: find executors by intent and label selector, never by URL.

* :class:`Registry`: the watch-fed cache of live, trusted records plus registration with
  heartbeats, on a JetStream KV bucket (it implements the bus's ``Directory``);
* :class:`AgentRecord`: what an agent serves and is, signed by its own key (JWS over the
  RFC 8785 form, as A2A signs cards); :func:`endorse` for operator endorsements;
* :func:`parse_selector`: Kubernetes label selectors.
"""

from .index import Index
from .record import AgentRecord, RecordRejected, default_card, endorse
from .registry import DEFAULT_TTL, REGISTRY_BUCKET, Registration, Registry
from .selector import Requirement, Selector, parse_selector

__all__ = [
    "DEFAULT_TTL",
    "REGISTRY_BUCKET",
    "AgentRecord",
    "Index",
    "RecordRejected",
    "Registration",
    "Registry",
    "Requirement",
    "Selector",
    "default_card",
    "endorse",
    "parse_selector",
]
