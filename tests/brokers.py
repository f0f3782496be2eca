"""More broker implementations for the tests, each as its registry ships it and run with its defaults:
amqtt (PyPI; 3.1.1 only, it never answers an MQTT 5 CONNECT that edged sends) in its own venv, Aedes (npm;
3.1.1 only, it refuses MQTT 5 with 0x84) with the machine's Node.js, mqttools' broker (PyPI; MQTT 5 only, and
QoS 0 only: CONNACK Maximum QoS 0) in its own venv, all installed by `scripts/setup dev` under `.brokers/`, and
ejabberd's `mod_mqtt` (Debian; MQTT 5 and 3.1.1; anonymous logins still need a user name, so `username` is
set). Each keeps its sessions and queued messages in memory, as by default: a crash loses what it had
acknowledged (the end-to-end replay is what recovers it). ejabberd keeps retained messages on disk (Mnesia).

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
MQTTOOLS = ROOT / ".brokers" / "mqttools" / "bin" / "mqttools"
AEDES = ROOT / ".brokers" / "aedes" / "node_modules" / "aedes" / "aedes.js"
AEDES_SCRIPT = Path(__file__).resolve().parent / "brokers" / "aedes.mjs"
EJABBERDCTL = Path("/usr/sbin/ejabberdctl")
START_TIMEOUT_S = 120  # ejabberd: about 20 s on a loaded 2-core machine


@dataclass
class OtherBroker:
    """One broker process listening on 127.0.0.1:`port`."""

    kind: str  # amqtt | aedes | ejabberd | mqttools
    workdir: Path
    host: str = "127.0.0.1"
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    username: str | None = None  # ejabberd: any user name, any password (anonymous), but one must be given

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
        if self.kind == "ejabberd":
            return self._ejabberd()
        if self.kind == "mqttools":  # MQTT 5 only, and QoS 0 only (CONNACK Maximum QoS 0)
            if not MQTTOOLS.exists():
                pytest.fail("mqttools is not installed; the README's test command installs it (.brokers/mqttools)")
            return [str(MQTTOOLS), "broker", "--host", self.host, "--port", str(self.port), "--secure-port",
                    str(free_port())], dict(os.environ)  # fmt: skip
        if not AEDES.exists():
            pytest.fail("aedes is not installed; the README's test command installs it (.brokers/aedes, npm)")
        return ["node", str(AEDES_SCRIPT), str(self.port)], os.environ | {"AEDES": str(AEDES)}

    def _ejabberd(self) -> tuple[list[str], dict[str, str]]:
        """ejabberd's own ejabberdctl, with its config, spool and logs in the workdir: a copy that runs as the
        current user (the packaged one switches to the `ejabberd` user, who cannot reach pytest's folders)."""
        if not EJABBERDCTL.exists():
            pytest.fail("ejabberd is not installed; the README's test command installs it (apt)")
        self.username = "edged@localhost"
        conf = self.workdir / "conf"
        conf.mkdir(exist_ok=True)
        (conf / "ejabberd.yml").write_text(
            'hosts: ["localhost"]\nloglevel: warning\nauth_method: [anonymous]\nanonymous_protocol: login_anon\n'
            f'listen:\n  - port: {self.port}\n    ip: "127.0.0.1"\n    module: mod_mqtt\n    backlog: 1000\n'
            "modules:\n  mod_mqtt: {}\n",
            encoding="utf-8",
        )
        (conf / "ejabberdctl.cfg").write_text('ERL_OPTIONS="-env ERL_CRASH_DUMP_BYTES 0"\n', encoding="utf-8")
        ctl = self.workdir / "ejabberdctl"
        script = EJABBERDCTL.read_text(encoding="utf-8").replace("\nINSTALLUSER=ejabberd\n", "\nINSTALLUSER=\n")
        ctl.write_text(script, encoding="utf-8")
        ctl.chmod(0o755)
        for sub in ("spool", "logs"):
            (self.workdir / sub).mkdir(exist_ok=True)
        argv = [str(ctl), "--config-dir", str(conf), "--config", str(conf / "ejabberd.yml"), "--spool",
                str(self.workdir / "spool"), "--logs", str(self.workdir / "logs"), "--node",
                f"edged{self.port}@localhost", "foreground"]  # fmt: skip
        return argv, os.environ | {"HOME": str(self.workdir)}

    def password_file(self) -> Path:
        """A password file for the user name (ejabberd takes any password for an anonymous login)."""
        path = self.workdir / "password"
        path.write_text("anything\n", encoding="utf-8")
        path.chmod(0o600)
        return path

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
        group = self.proc.pid
        try:
            os.killpg(group, sig)
            self.proc.wait(30)
            # the whole group, not only its leader: ejabberdctl's shell ends at once, its Erlang VM after it
            wait_for(lambda: not _alive(group), 60, f"{self.kind}'s processes gone")
        except (subprocess.TimeoutExpired, AssertionError):
            os.killpg(group, signal.SIGKILL)
            self.proc.wait(10)
        except ProcessLookupError:
            pass
        self.proc = None


def _alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True
