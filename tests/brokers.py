"""More broker implementations for the tests, each as its registry ships it and run with its defaults:
amqtt (PyPI; 3.1.1 only, it never answers an MQTT 5 CONNECT that edged sends) in its own venv, and Aedes
(npm; 3.1.1 only, it refuses MQTT 5 with 0x84) with the machine's Node.js. `scripts/setup dev` installs both
under `.brokers/`. Both keep their sessions and queued messages in memory, as by default: a crash loses what
they had acknowledged (the end-to-end replay is what recovers it).

Each is started in its own process group, with `host` and `port` as conftest.Broker's, so `subscribe` and
the daemon's config take them alike; `kill()` is a crash (SIGKILL), `stop()` a clean stop.
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import answers, free_port, wait_for

ROOT = Path(__file__).resolve().parent.parent
AMQTT = ROOT / ".brokers" / "amqtt" / "bin" / "amqtt"
AEDES = ROOT / ".brokers" / "aedes" / "node_modules" / "aedes" / "aedes.js"
AEDES_SCRIPT = Path(__file__).resolve().parent / "brokers" / "aedes.mjs"
START_TIMEOUT_S = 60


@dataclass
class OtherBroker:
    """One broker process listening on 127.0.0.1:`port`."""

    kind: str  # amqtt | aedes
    workdir: Path
    host: str = "127.0.0.1"
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        self.port = self.port or free_port()
        self.workdir.mkdir(parents=True, exist_ok=True)

    def command(self) -> tuple[list[str], dict[str, str]]:
        if self.kind == "amqtt":
            if not AMQTT.exists():
                pytest.fail("amqtt is not installed; the README's test command installs it (.brokers/amqtt)")
            conf = self.workdir / "amqtt.yaml"
            conf.write_text(
                f"listeners:\n  default:\n    type: tcp\n    bind: 127.0.0.1:{self.port}\n"
                "plugins:\n  amqtt.plugins.authentication.AnonymousAuthPlugin:\n    allow_anonymous: true\n",
                encoding="utf-8",
            )
            return [str(AMQTT), "-c", str(conf)], dict(os.environ)
        if not AEDES.exists():
            pytest.fail("aedes is not installed; the README's test command installs it (.brokers/aedes, npm)")
        return ["node", str(AEDES_SCRIPT), str(self.port)], os.environ | {"AEDES": str(AEDES)}

    def start(self) -> None:
        argv, env = self.command()
        with (self.workdir / f"{self.kind}.log").open("ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=out, env=env, start_new_session=True)
        wait_for(self._answers, START_TIMEOUT_S, f"{self.kind} on port {self.port}")

    def _answers(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            log = (self.workdir / f"{self.kind}.log").read_text(encoding="utf-8", errors="replace")[-2000:]
            pytest.fail(f"{self.kind} exited with {self.proc.returncode}: {log}")
        return answers(self.host, self.port)

    def kill(self) -> None:
        """A crash: SIGKILL, nothing written anywhere."""
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        self._signal(signal.SIGTERM)

    def _signal(self, sig: int) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        except ProcessLookupError:
            pass
        self.proc = None
