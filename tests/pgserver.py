"""A real PostgreSQL server for the tests: Debian's package, a fresh cluster in a temporary folder.

Started when the package is installed (scripts/setup dev installs it); otherwise the tests that need it
are skipped with the reason. As root, the server runs as the `postgres` user (initdb refuses root).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest


def postgres_bin() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return found[-1].parent if found else None


@dataclass
class PgServer:
    bindir: Path
    datadir: Path
    port: int
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"postgresql://edged@127.0.0.1:{self.port}/postgres"

    def _as_owner(self) -> dict[str, object]:
        if os.geteuid() != 0:
            return {}
        user = pwd.getpwnam("postgres")
        return {"user": user.pw_uid, "group": user.pw_gid}

    def init(self) -> None:
        self.datadir.mkdir(parents=True)
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            for path in (self.datadir.parent, self.datadir):
                os.chown(path, user.pw_uid, user.pw_gid)
        subprocess.run(
            [str(self.bindir / "initdb"), "-D", str(self.datadir), "-U", "edged", "-A", "trust", "--no-sync"],
            check=True, capture_output=True, **self._as_owner(),  # type: ignore[call-overload]
        )  # fmt: skip

    def start(self) -> None:
        with (self.datadir.parent / "postgres.log").open("ab") as log:
            self.proc = subprocess.Popen(  # type: ignore[call-overload]
                [str(self.bindir / "postgres"), "-D", str(self.datadir), "-p", str(self.port),
                 "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.datadir}"],
                stdout=log, stderr=log, **self._as_owner(),
            )  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ready = [str(self.bindir / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)]
            if subprocess.run(ready, check=False, capture_output=True).returncode == 0:
                return
            time.sleep(0.1)
        raise AssertionError("PostgreSQL did not start within 30 s (see postgres.log)")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGINT)  # "fast" shutdown: clients are disconnected (smart waits for them)
            self.proc.wait(30)
            self.proc = None


def make_server(workdir: Path, port: int) -> PgServer:
    bindir = postgres_bin()
    if bindir is None:
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql; scripts/setup dev does it)")
    if os.geteuid() == 0 and shutil.which("initdb", path=str(bindir)) is None:
        pytest.skip("PostgreSQL's initdb is missing")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no postgres user to run the server as")
    return PgServer(bindir, workdir / "pgdata", port)
