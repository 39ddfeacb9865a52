"""A 3-node nats-server cluster with JetStream on loopback, for durability tests."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

from bus import EmbeddedServer


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Cluster:
    """Three servers, routes between them, each with its own store."""

    def __init__(self, sync_interval: str = "always") -> None:
        routes = free_ports(3)
        self.nodes = [
            EmbeddedServer(
                name=f"n{i}",
                cluster=("intentbus-test", routes[i], [p for j, p in enumerate(routes) if j != i]),
                sync_interval=sync_interval,
            )
            for i in range(3)
        ]
        self.urls: list[str] = []

    def start(self) -> str:
        self.urls = [node.start() for node in self.nodes]
        return ",".join(self.urls)

    @property
    def url(self) -> str:
        return ",".join(self.urls)

    def node_named(self, name: str) -> EmbeddedServer:
        return next(n for n in self.nodes if n.name == name)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


@contextmanager
def running_cluster(sync_interval: str = "always") -> Iterator[Cluster]:
    cluster = Cluster(sync_interval)
    cluster.start()
    try:
        time.sleep(0.5)  # routes connect
        yield cluster
    finally:
        cluster.stop()
