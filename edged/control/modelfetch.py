"""Fetch a rollout's model into `<state_dir>/models/<sha256>.onnx`, checking size and hash on the way.

Two ways in: an `http(s)://` URL (a file server on the local network, or the one `edged fleet rollout
--serve` starts), or chunks over MQTT that `edged fleet rollout --via mqtt` leaves retained on
`edged/fleet/models/<sha256>/<index>` (with `.../manifest`: size and chunk count), for brokers that allow
large retained messages. Bytes go to a temporary file beside the target while they are hashed; only a
file whose sha256 is the one the command named (and signed) is renamed into place. A model already there
with that hash is used again without a download.
"""

from __future__ import annotations

import logging
import os
import ssl
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from http.client import HTTPMessage
from pathlib import Path
from typing import IO

from edged.core.durable import commit, make_dirs
from edged.core.errors import CommandError
from edged.core.safejson import loads_object
from edged.model.session import file_sha256

log = logging.getLogger(__name__)

CHUNK = 1 << 16
READ_TIMEOUT_S = 10.0  # one read waits at most this long (the whole download: control.download_timeout_s)
MQTT_PREFIX = "edged/fleet/models"


def model_path(folder: Path, sha256: str) -> Path:
    """Where a fetched model lives."""
    return folder / f"{sha256}.onnx"


def _write_verified(folder: Path, sha256: str, max_bytes: int, fill: Callable[[IO[bytes], int], None]) -> Path:
    """Let `fill` write into a temporary file (at most `max_bytes`), then check the hash and rename."""
    make_dirs(folder, 0o750)
    fd, name = tempfile.mkstemp(dir=folder, prefix=".fetch-", suffix=".part")
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as out:
            fill(out, max_bytes)
        got = file_sha256(tmp)
        if got != sha256:
            raise CommandError("hash_mismatch", f"the model fetched has sha256 {got[:16]}..., not {sha256[:16]}...")
        tmp.chmod(0o640)
        target = model_path(folder, sha256)
        commit(tmp, target)  # durable before the config names it: a cut never leaves a config on an empty file
        return target
    finally:
        tmp.unlink(missing_ok=True)


class _HttpOnlyRedirects(urllib.request.HTTPRedirectHandler):
    """Follow a redirect only to http(s): urllib's own also follows one to ftp:// (or to whatever a handler
    takes), which a model server has no business sending the device to."""

    def redirect_request(  # noqa: PLR0917  (urllib's signature)
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        if urllib.parse.urlsplit(newurl).scheme not in ("http", "https"):
            fp.close()  # urllib closes the redirect's response only when it follows it
            raise CommandError("download_failed", f"redirected to {newurl[:60]!r}: only http(s) is followed")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def fetch_url(url: str, folder: Path, sha256: str, *, max_bytes: int, timeout: float,
              ca_file: Path | None = None) -> Path:  # fmt: skip
    """Download over http(s) within `timeout` seconds in all (not per read: a server that drips a byte now
    and then cannot hold the rollout, and every other command behind it, for longer); CommandError
    `download_failed`, `too_large` or `hash_mismatch`."""
    existing = model_path(folder, sha256)
    if existing.is_file() and file_sha256(existing) == sha256:
        return existing
    if not url.startswith(("http://", "https://")):
        raise CommandError("malformed", f"the model URL must be http:// or https://, not {url[:40]!r}")
    context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context), _HttpOnlyRedirects())
    deadline = time.monotonic() + timeout

    def fill(out: IO[bytes], limit: int) -> None:
        try:
            with opener.open(url, timeout=min(timeout, READ_TIMEOUT_S)) as response:
                length = response.headers.get("Content-Length")
                if length is not None and (not length.isdigit() or len(length) > 15 or int(length) > limit):
                    raise CommandError("too_large", f"the model is {length[:20]} bytes; the limit is {limit}")
                total = 0
                while block := response.read1(CHUNK):  # what has come: a dripping server is seen between reads
                    total += len(block)
                    if total > limit:
                        raise CommandError("too_large", f"the model is over the limit of {limit} bytes")
                    if time.monotonic() > deadline:
                        raise CommandError("download_failed", f"{url}: not downloaded within {timeout:g} s")
                    out.write(block)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise CommandError("download_failed", f"{url}: {exc}") from exc

    return _write_verified(folder, sha256, max_bytes, fill)


class ChunkCollector:
    """The retained chunks of one model as they arrive on `<prefix>/<sha256>/<index>` (paho's thread)."""

    def __init__(self, sha256: str, max_bytes: int) -> None:
        self.sha256 = sha256
        self.max_bytes = max_bytes
        self.total = 0
        self.chunks: dict[int, bytes] = {}
        self.count: int | None = None
        self.size: int | None = None
        self.error: str | None = None
        self.done = threading.Event()
        self.lock = threading.Lock()

    def offer(self, topic: str, payload: bytes) -> None:
        """One message of the model's topic tree."""
        last = topic.rsplit("/", 1)[-1]
        with self.lock:
            if last == "manifest":
                try:
                    manifest = loads_object(payload, max_bytes=4096, what="model manifest")
                    self.count, self.size = int(manifest["chunks"]), int(manifest["size"])
                except (ValueError, KeyError, TypeError):
                    self.error = "the model's manifest is not {chunks, size} JSON"
            elif last.isdigit() and len(last) <= 9 and int(last) not in self.chunks:
                self.total += len(payload)
                if self.total > self.max_bytes:  # memory stays bounded whatever arrives
                    self.error = f"the model is over the limit of {self.max_bytes} bytes"
                    self.chunks.clear()
                else:
                    self.chunks[int(last)] = bytes(payload)
            if self.error or (self.count is not None and len(self.chunks) >= self.count):
                self.done.set()

    def write(self, out: IO[bytes], limit: int) -> None:
        """The chunks in order into `out`."""
        with self.lock:
            if self.error:
                raise CommandError("too_large" if "limit" in self.error else "download_failed", self.error)
            if self.count is None or self.size is None or len(self.chunks) < self.count:
                have = len(self.chunks)
                raise CommandError("download_failed", f"{have} of {self.count or '?'} chunks of the model arrived")
            if self.size > limit:
                raise CommandError("too_large", f"the model is {self.size} bytes; the limit is {limit}")
            total = 0
            for i in range(self.count):
                block = self.chunks.get(i, b"")
                total += len(block)
                if total > limit:
                    raise CommandError("too_large", f"the model is over the limit of {limit} bytes")
                out.write(block)


def write_chunks(collector: ChunkCollector, folder: Path, *, max_bytes: int) -> Path:
    """The collected chunks, hash-checked, into place."""
    return _write_verified(folder, collector.sha256, max_bytes, collector.write)
