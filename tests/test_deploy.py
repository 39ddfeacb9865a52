"""The deploy/ configs are valid nats-server configs, and they fsync every write."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from bus import find_nats_server

DEPLOY = Path(__file__).parents[1] / "deploy"
CONFIGS = sorted((DEPLOY / "nats").glob("*.conf"))


def _k8s_config(tmp: Path) -> Path:
    text = (DEPLOY / "k8s" / "nats.yaml").read_text()
    block = text.split("nats.conf: |\n", 1)[1].split("\n---", 1)[0]
    lines = [line[4:] for line in block.splitlines()]
    out = tmp / "k8s-nats.conf"
    out.write_text("\n".join(lines) + "\n")
    return out


def _check(conf: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, POD_NAME="intentbus-nats-0")
    return subprocess.run(
        [find_nats_server(), "-t", "-c", str(conf)], capture_output=True, text=True, env=env
    )


@pytest.mark.parametrize("conf", CONFIGS, ids=[c.name for c in CONFIGS])
def test_config_is_valid_and_durable(conf: Path) -> None:
    result = _check(conf)
    assert result.returncode == 0, result.stderr
    assert "sync_interval: always" in conf.read_text()


def test_kubernetes_config_is_valid(tmp_path: Path) -> None:
    conf = _k8s_config(tmp_path)
    result = _check(conf)
    assert result.returncode == 0, result.stderr
    assert "sync_interval: always" in conf.read_text()


def test_the_check_itself_catches_a_broken_config(tmp_path: Path) -> None:
    bad = tmp_path / "bad.conf"
    bad.write_text("jetstream { sync_interval: bogus }\n")
    assert _check(bad).returncode != 0
