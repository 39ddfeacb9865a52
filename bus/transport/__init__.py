"""The transport seam: one Protocol, a nats-py adapter and an in-memory twin."""

from .base import KeyValue, Msg, MsgHandler, Subscription, Transport, is_no_responders
from .memory import MemoryBroker, MemoryTransport

__all__ = [
    "KeyValue",
    "MemoryBroker",
    "MemoryTransport",
    "Msg",
    "MsgHandler",
    "Subscription",
    "Transport",
    "is_no_responders",
]
