"""A second broker implementation for the tests: RabbitMQ with its MQTT plugin, from Debian's packages
(`scripts/setup dev` installs `rabbitmq-server`; Debian 12 ships 3.10, whose MQTT plugin speaks 3.1.1 only,
so it also shows what edged does with a broker that refuses MQTT 5).

Each instance is its own node (name, ports, data and logs in the test's directory), started in the
foreground like Mosquitto and stopped with its process group.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import answers, free_port, wait_for

SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
START_TIMEOUT_S = 180  # about 10 s on an idle 2-core machine; much more beside stress-ng


@dataclass
class RabbitMQ:
    """One RabbitMQ node listening for MQTT on 127.0.0.1:`port` (`host` and `port` as conftest.Broker's)."""

    workdir: Path
    host: str = "127.0.0.1"
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        self.port = self.port or free_port()
        self._amqp, self._dist = free_port(), free_port()
        self.workdir.mkdir(parents=True, exist_ok=True)

    def start(self) -> None:
        if not SERVER.exists() and shutil.which("rabbitmq-server") is None:
            pytest.fail("rabbitmq-server is not installed; the README's test command installs it (apt)")
        (self.workdir / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = {self._amqp}\nmqtt.listeners.tcp.default = {self.port}\n"
            "mqtt.allow_anonymous = true\nloopback_users = none\n",
            encoding="utf-8",
        )
        (self.workdir / "enabled_plugins").write_text("[rabbitmq_mqtt].\n", encoding="utf-8")
        env = os.environ | {
            "HOME": str(self.workdir),  # the Erlang cookie
            "RABBITMQ_NODENAME": f"edged{self.port}@localhost",
            "RABBITMQ_DIST_PORT": str(self._dist),
            "RABBITMQ_MNESIA_BASE": str(self.workdir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.workdir / "log"),
            "RABBITMQ_CONFIG_FILE": str(self.workdir / "rabbitmq"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.workdir / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(self.workdir / "pid"),
        }
        exe = str(SERVER) if SERVER.exists() else "rabbitmq-server"
        with (self.workdir / "rabbitmq.out").open("ab") as out:
            self.proc = subprocess.Popen([exe], stdout=out, stderr=out, env=env, start_new_session=True)
        wait_for(self._answers, START_TIMEOUT_S, f"rabbitmq's MQTT listener on port {self.port}")

    def _answers(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            log = (self.workdir / "rabbitmq.out").read_text(encoding="utf-8", errors="replace")[-2000:]
            pytest.fail(f"rabbitmq-server exited with {self.proc.returncode}: {log}")
        return answers(self.host, self.port)

    def stop(self) -> None:
        """Stop the node (its whole process group: the script, the Erlang VM and its helpers)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        except ProcessLookupError:
            pass
        self.proc = None
