"""End to end through the console script: ``intentbus up --json`` and ``intentbus request``."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CLI = [sys.executable, "-c", "import sys; from agents.cli import main; sys.exit(main())"]


def run(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[dict[str, Any]]:
    keys = tmp_path / "keys"
    made = run("keys", "new", "--agent-id", "cli-user", "--out", str(keys))
    assert made.returncode == 0, made.stderr
    log = (tmp_path / "up.log").open("w")
    proc = subprocess.Popen(
        [*CLI, "up", "--json", "--trust", str(keys / "cli-user.pub")],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    assert proc.stdout is not None
    ready = json.loads(proc.stdout.readline())
    trust = tmp_path / "fleet.json"
    trust.write_text(
        json.dumps(
            [{"agent_id": a["agent_id"], "public_key": a["public_key"]} for a in ready["agents"]]
        )
    )
    yield {
        "ready": ready,
        "key": str(keys / "cli-user.key"),
        "trust": str(trust),
        "proc": proc,
        "public": made.stdout.strip(),
    }
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    proc.stdout.close()
    log.close()


def test_keys_new_prints_the_public_key_and_refuses_to_overwrite(tmp_path: Path) -> None:
    first = run("keys", "new", "--agent-id", "a1", "--out", str(tmp_path))
    assert first.returncode == 0 and len(first.stdout.strip()) == 43
    again = run("keys", "new", "--agent-id", "a1", "--out", str(tmp_path))
    assert again.returncode == 2 and "not overwriting" in again.stderr
    bad = run("keys", "new", "--agent-id", "bad id", "--out", str(tmp_path))
    assert bad.returncode == 2 and "invalid agent id" in bad.stderr


def test_up_then_request_then_clean_shutdown(fleet: dict[str, Any]) -> None:
    ready = fleet["ready"]
    echo = [a for a in ready["agents"] if "demo.echo" in a["intents"]]
    assert len(echo) == 1 and len(echo[0]["public_key"]) == 43
    url = ready["nats_url"]
    common = ["--key", fleet["key"], "--nats", url, "--trust", fleet["trust"], "--timeout", "10"]

    ok = run("request", "demo.echo", '{"hello": ["fleet", 1]}', *common)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout) == {"hello": ["fleet", 1]}

    chained = run("request", "task.execute", '{"q": "nats"}', *common)
    assert json.loads(chained.stdout)["answer"] == "a subject-based messaging system"

    by_label = run("request", "task.execute", '{"q": "ed25519"}', "-l", "framework=hermes", *common)
    assert by_label.returncode == 0, by_label.stderr
    assert json.loads(by_label.stdout)["by"] == "executor-1"
    nobody = run("request", "task.execute", "{}", "-l", "env=prod", *common)
    assert nobody.returncode == 1 and "NoExecutorError" in nobody.stderr
    bad_sel = run("request", "task.execute", "{}", "-l", "env in (x", *common)
    assert bad_sel.returncode == 2 and "position 9" in bad_sel.stderr

    listed = run("agents", "ls", "--nats", url, "--json", "--trust", fleet["trust"])
    rows = {r["agent_id"]: r for r in json.loads(listed.stdout)}
    assert set(rows) == {"planner", "executor-1", "facts-1"}
    assert rows["executor-1"]["trust"] == "trusted"
    assert rows["executor-1"]["labels"]["framework"] == "hermes"
    hermes = run(
        "agents",
        "ls",
        "--nats",
        url,
        "--json",
        "-l",
        "framework=hermes",
        "--intent",
        "task.execute",
    )
    assert [r["agent_id"] for r in json.loads(hermes.stdout)] == ["executor-1"]
    shown = run("agents", "show", "facts-1", "--nats", url)
    assert json.loads(shown.stdout)["intents"] == ["facts.lookup", "quote.get"]
    missing = run("agents", "show", "nobody", "--nats", url)
    assert missing.returncode == 1 and "no live agent" in missing.stderr

    keyed = ["--key", fleet["key"], "--nats", url, "--trust", fleet["trust"]]
    fan = run("fanout", "quote.get", "{}", "-l", "env=demo", "--json", *keyed)
    assert fan.returncode == 0, fan.stderr
    gathered = json.loads(fan.stdout)
    assert gathered["satisfied"] and gathered["missing"] == []
    assert sorted(r["agent_id"] for r in gathered["replies"]) == ["executor-1", "facts-1"]

    sent = run("send", "order.place", '{"amount": 5000}', *keyed)
    assert sent.returncode == 0, sent.stderr
    request_id = json.loads(sent.stdout)["request_id"]
    for _ in range(50):
        listed = json.loads(run("pending", "ls", "--json", *keyed).stdout)
        if any(e["request_id"] == request_id for e in listed):
            break
        time.sleep(0.2)
    else:
        raise AssertionError("the order was never parked")
    refused = run("pending", "approve", request_id, *keyed)  # only the planner may review
    assert refused.returncode == 1 and "review.forbidden" in refused.stderr
    unknown = run("pending", "decline", "0" * 32, *keyed)
    assert unknown.returncode == 2 and "no parked request" in unknown.stderr

    failed = run("request", "task.execute", '{"q": "quantum"}', *common)
    assert failed.returncode == 1 and "facts.unknown" in failed.stderr

    untrusting = run(
        "request", "demo.echo", "{}", "--key", fleet["key"], "--nats", url, "--timeout", "2"
    )
    assert untrusting.returncode == 1 and "unknown_signer" in untrusting.stderr

    bad_json = run("request", "demo.echo", "{nope", *common)
    assert bad_json.returncode == 2 and "payload is not JSON" in bad_json.stderr
    bad_intent = run("request", "Demo.Echo", "{}", *common)
    assert bad_intent.returncode == 2 and "invalid intent" in bad_intent.stderr

    proc = fleet["proc"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    host, port = url.removeprefix("nats://").split(":")
    with pytest.raises(OSError):  # the embedded server went down with it
        socket.create_connection((host, int(port)), timeout=1).close()


def test_demo_runs_the_whole_scenario() -> None:
    out = run("demo", timeout=60)
    assert out.returncode == 0, out.stderr
    for expected in (
        "[facts-1] <- facts.lookup from executor-1",
        "refused it: bad_signature",
        "NoRespondersError",
        "code=facts.unknown",
    ):
        assert expected in out.stdout
