"""A power-cut filesystem: FUSE over memory that forgets, on command, every write not made durable by fsync.

The way power-loss tests are done for databases: the filesystem keeps two states of every file and folder,
what the programs see now and what a disk would still hold after the power went (the durable state). Only
the calls that make data durable on a real disk move the durable state on:

- `fsync`/`fdatasync` of a file makes its content (and size, mode) durable, not its name;
- `fsync` of a folder makes its entries durable as they are (creates, renames, unlinks in it);
- nothing else: not `close`, not `rename`, not time. A file created, written and renamed but never
  fsync'd (nor its folder) is gone after a cut; one whose folder was fsync'd but not its data is empty,
  as on ext4 with delayed allocation.

That is stricter than most real filesystems, which is the point: code that survives here follows the POSIX
rules, not a filesystem's kindness. `--journal` models ext4 (data=ordered) instead: an fsync of any file
commits the journal, so every folder's entries (creates, renames, unlinks made so far) become durable with it.

Control, through the special file `.powercut` at the mount's root (so any process can drive it):
- write `cut` (or `cut tear`): the power goes now. Every call after it fails with EIO until `boot`, so
  nothing a still-running process does can land. `tear` also applies the first half of the last unsynced
  write to the durable state of its file (a torn sector write).
- write `boot`: the machine comes back: what programs see is the durable state.
- write `freeze PID`: a cut first stops that process (SIGSTOP), as a power cut stops every program at once;
  the test kills it after the cut. Without it, a program would go on running (and publishing) for a moment
  on a dead disk, which no real power cut allows.
- write `arm write|fsync PATTERN N [tear]`: cut by itself at the N-th write (or fsync) of a file whose name
  matches PATTERN (fnmatch), before that call lands (`tear`: half of that write lands): a cut at an exact
  moment, such as the first write of a WAL checkpoint into the database file.
- read it: one line of JSON, counters (bytes written, fsyncs, cuts) and `dead` (a reader takes the first line:
  the kernel may read it in two calls while the counters move).

`--fsync-delay-ms A[-B]` makes every fsync take that long (uniform in A..B): slow flash such as an SD card.
The helper `PowerCutFS` mounts one in a child process and drives it. Run as `python tests/powercut.py MOUNT`.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fnmatch
import json
import os
import random
import re
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CONTROL = ".powercut"
BLOCK = 4096


@dataclass
class Node:
    """An inode: a file's bytes or a folder's entries, now and as durable."""

    mode: int
    data: bytearray = field(default_factory=bytearray)
    synced: bytes = b""
    synced_mode: int = 0
    entries: dict[str, Node] = field(default_factory=dict)
    synced_entries: dict[str, Node] = field(default_factory=dict)
    target: str = ""  # a symbolic link's
    mtime: float = field(default_factory=time.time)

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)


@dataclass
class Counters:
    """What the filesystem saw: what a benchmark reads to tell the cost of durability."""

    bytes_written: int = 0
    writes: int = 0
    fsyncs: int = 0
    dir_fsyncs: int = 0
    cuts: int = 0
    synced: dict[str, int] = field(default_factory=dict)  # fsyncs per file name (a folder's ends in /)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class PowerCutOps:
    """The FUSE operations (mfusepy's high-level API, paths as str)."""

    use_ns = True  # utimens gets nanoseconds

    def __init__(self, fsync_delay_s: tuple[float, float] = (0.0, 0.0), *, journal: bool = False) -> None:
        self.journal = journal
        self.root = Node(stat.S_IFDIR | 0o755)
        self.root.synced_mode = self.root.mode
        self.mutex = threading.RLock()
        self.dead = False
        self.handles: dict[int, Node] = {}
        self.next_fh = 1
        self.counters = Counters()
        self.last_write: tuple[Node, int, bytes] | None = None
        self.delay = fsync_delay_s
        self.freeze_pid = 0
        self.armed: tuple[str, str, int, bool] | None = None  # (write|fsync, pattern, calls left, tear)

    # -- the model -------------------------------------------------------------------------------------

    def _alive(self) -> None:
        if self.dead:
            raise _err(errno.EIO)

    def _lookup(self, path: str) -> Node:
        node = self.root
        for part in [p for p in path.split("/") if p]:
            if not node.is_dir or part not in node.entries:
                raise _err(errno.ENOENT)
            node = node.entries[part]
        return node

    def _parent(self, path: str) -> tuple[Node, str]:
        head, _, name = path.rstrip("/").rpartition("/")
        parent = self._lookup(head or "/")
        if not parent.is_dir:
            raise _err(errno.ENOTDIR)
        return parent, name

    def _handle(self, path: str, fh: int | None) -> Node:
        if fh and fh in self.handles:
            return self.handles[fh]
        return self._lookup(path)

    def _new_handle(self, node: Node) -> int:
        fh = self.next_fh
        self.next_fh += 1
        self.handles[fh] = node
        return fh

    def cut(self, *, tear: bool) -> None:
        """The power goes: the durable state is all there is; every call fails until boot."""
        with self.mutex:
            if self.freeze_pid:
                with contextlib.suppress(OSError):
                    os.kill(self.freeze_pid, signal.SIGSTOP)
            self.armed = None
            if tear and self.last_write is not None:
                node, offset, data = self.last_write
                torn = bytearray(node.synced)
                half = data[: max(1, len(data) // 2)]
                if len(torn) < offset:
                    torn.extend(b"\0" * (offset - len(torn)))
                torn[offset : offset + len(half)] = half
                node.synced = bytes(torn)
            self.dead = True
            self.counters.cuts += 1
            self.handles.clear()
            self.last_write = None

    def boot(self) -> None:
        """The machine comes back with what was durable."""
        with self.mutex:
            seen: set[int] = set()

            def restore(node: Node) -> None:
                if id(node) in seen:
                    return
                seen.add(id(node))
                node.mode = node.synced_mode or node.mode
                if node.is_dir:
                    node.entries = dict(node.synced_entries)
                    for child in node.entries.values():
                        restore(child)
                else:
                    node.data = bytearray(node.synced)

            restore(self.root)
            self.dead = False

    def _sync_file(self, node: Node) -> None:
        if self.journal:  # ext4: the fsync commits the journal, and with it every folder's entries
            self._sync_all_dirs(self.root, set())
        node.synced = bytes(node.data)
        node.synced_mode = node.mode
        if self.last_write is not None and self.last_write[0] is node:
            self.last_write = None
        self.counters.fsyncs += 1

    def _sync_all_dirs(self, node: Node, seen: set[int]) -> None:
        if id(node) in seen:
            return
        seen.add(id(node))
        node.synced_entries = dict(node.entries)
        for child in node.entries.values():
            if child.is_dir:
                self._sync_all_dirs(child, seen)

    def _sync_dir(self, node: Node) -> None:
        node.synced_entries = dict(node.entries)
        node.synced_mode = node.mode
        self.counters.dir_fsyncs += 1

    def _slow(self) -> None:
        low, high = self.delay
        if high > 0:
            time.sleep(random.uniform(low, high))  # the fault itself: an fsync that takes this long (slow flash)

    # -- the control file ------------------------------------------------------------------------------

    def _trip(self, call: str, path: str, offset: int = 0, data: bytes = b"") -> None:
        """Cut now if an armed trigger matches this call (the call then fails: it never landed)."""
        if self.armed is None:
            return
        kind, pattern, left, tear = self.armed
        if kind != call or not fnmatch.fnmatch(path.rpartition("/")[2], pattern):
            return
        if left > 1:
            self.armed = (kind, pattern, left - 1, tear)
            return
        if tear and data:
            self.last_write = (self._lookup(path), offset, data)
        self.cut(tear=tear)
        raise _err(errno.EIO)

    def _control(self, data: bytes) -> None:
        words = data.decode().split()
        if words[:1] == ["cut"]:
            self.cut(tear="tear" in words)
        elif words[:1] == ["boot"]:
            self.boot()
        elif words[:1] == ["freeze"]:
            self.freeze_pid = int(words[1])
        elif words[:1] == ["arm"]:
            self.armed = (words[1], words[2], int(words[3]), "tear" in words[4:])
        elif words[:1] == ["reset-counters"]:
            self.counters = Counters()

    # -- FUSE operations -------------------------------------------------------------------------------

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        if path == "/" + CONTROL:
            return {"st_mode": stat.S_IFREG | 0o666, "st_nlink": 1, "st_size": BLOCK}  # read pads with NULs
        with self.mutex:
            self._alive()
            node = self._handle(path, fh)
            size = len(node.data) if not node.is_dir else BLOCK
            if stat.S_ISLNK(node.mode):
                size = len(node.target)
            return {
                "st_mode": node.mode, "st_nlink": 2 if node.is_dir else 1, "st_size": size,
                "st_uid": os.getuid(), "st_gid": os.getgid(), "st_blocks": (size + 511) // 512,
                "st_mtime": node.mtime, "st_atime": node.mtime, "st_ctime": node.mtime, "st_blksize": BLOCK,
            }  # fmt: skip

    def readdir(self, path: str, fh: int) -> list[str]:
        with self.mutex:
            self._alive()
            node = self._lookup(path)
            names = [".", "..", *node.entries]
            return [*names, CONTROL] if path == "/" else names

    def opendir(self, path: str) -> int:
        with self.mutex:
            self._alive()
            return self._new_handle(self._lookup(path))

    def releasedir(self, path: str, fh: int) -> int:
        with self.mutex:
            self.handles.pop(fh, None)
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        self._note_sync(path + "/")
        self._slow()
        with self.mutex:
            self._alive()
            self._trip("fsync", path)
            self._sync_dir(self._handle(path, fh))
        return 0

    def mkdir(self, path: str, mode: int) -> int:
        with self.mutex:
            self._alive()
            parent, name = self._parent(path)
            if name in parent.entries:
                raise _err(errno.EEXIST)
            parent.entries[name] = Node(stat.S_IFDIR | (mode & 0o7777))
        return 0

    def rmdir(self, path: str) -> int:
        with self.mutex:
            self._alive()
            parent, name = self._parent(path)
            node = self._lookup(path)
            if node.entries:
                raise _err(errno.ENOTEMPTY)
            del parent.entries[name]
        return 0

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        with self.mutex:
            self._alive()
            parent, name = self._parent(path)
            node = parent.entries.get(name)
            if node is None:
                node = Node(stat.S_IFREG | (mode & 0o7777))
                parent.entries[name] = node
            return self._new_handle(node)

    def mknod(self, path: str, mode: int, dev: int) -> int:
        with self.mutex:
            self._alive()
            parent, name = self._parent(path)
            parent.entries[name] = Node(mode)
        return 0

    def open(self, path: str, flags: int) -> int:
        if path == "/" + CONTROL:
            return 0
        with self.mutex:
            self._alive()
            node = self._lookup(path)
            if flags & os.O_TRUNC:
                node.data = bytearray()
            return self._new_handle(node)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        if path == "/" + CONTROL:
            with self.mutex:
                body = json.dumps({"dead": self.dead, **self.counters.as_dict()}).encode() + b"\n"
            return body[offset : offset + size]
        with self.mutex:
            self._alive()
            node = self._handle(path, fh)
            return bytes(node.data[offset : offset + size])

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        if path == "/" + CONTROL:
            self._control(data)
            return len(data)
        with self.mutex:
            self._alive()
            self._trip("write", path, offset, data)
            node = self._handle(path, fh)
            if len(node.data) < offset:
                node.data.extend(b"\0" * (offset - len(node.data)))
            node.data[offset : offset + len(data)] = data
            node.mtime = time.time()
            self.counters.bytes_written += len(data)
            self.counters.writes += 1
            self.last_write = (node, offset, bytes(data))
            return len(data)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        if path == "/" + CONTROL:
            return 0
        with self.mutex:
            self._alive()
            node = self._handle(path, fh)
            if length < len(node.data):
                del node.data[length:]
            else:
                node.data.extend(b"\0" * (length - len(node.data)))
        return 0

    def fallocate(self, path: str, mode: int, offset: int, length: int, fh: int) -> int:
        with self.mutex:
            self._alive()
            node = self._handle(path, fh)
            if offset + length > len(node.data):
                node.data.extend(b"\0" * (offset + length - len(node.data)))
        return 0

    def _note_sync(self, path: str) -> None:
        name = path.rpartition("/")[2] if not path.endswith("/") else path
        name = re.sub(r"\.[A-Za-z0-9_]{8}\.tmp$", ".*.tmp", name)  # one entry for all of a file's temporaries
        with self.mutex:
            self.counters.synced[name] = self.counters.synced.get(name, 0) + 1

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        self._note_sync(path)
        self._slow()
        with self.mutex:
            self._alive()
            self._trip("fsync", path)
            self._sync_file(self._handle(path, fh))
        return 0

    def flush(self, path: str, fh: int) -> int:
        return 0

    def release(self, path: str, fh: int) -> int:
        with self.mutex:
            self.handles.pop(fh, None)
        return 0

    def unlink(self, path: str) -> int:
        with self.mutex:
            self._alive()
            parent, name = self._parent(path)
            if name not in parent.entries:
                raise _err(errno.ENOENT)
            del parent.entries[name]
        return 0

    def rename(self, old: str, new: str) -> int:
        with self.mutex:
            self._alive()
            src, a = self._parent(old)
            dst, b = self._parent(new)
            if a not in src.entries:
                raise _err(errno.ENOENT)
            node = src.entries.pop(a)
            dst.entries[b] = node
        return 0

    def link(self, target: str, source: str) -> int:
        with self.mutex:
            self._alive()
            parent, name = self._parent(target)
            parent.entries[name] = self._lookup(source)
        return 0

    def symlink(self, target: str, source: str) -> int:
        with self.mutex:
            self._alive()
            parent, name = self._parent(target)
            parent.entries[name] = Node(stat.S_IFLNK | 0o777, target=source)
        return 0

    def readlink(self, path: str) -> str:
        with self.mutex:
            self._alive()
            return self._lookup(path).target

    def chmod(self, path: str, mode: int) -> int:
        with self.mutex:
            self._alive()
            node = self._lookup(path)
            node.mode = (node.mode & ~0o7777) | (mode & 0o7777)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        with self.mutex:
            self._alive()
            self._lookup(path).mtime = times[1] / 1e9 if times else time.time()
        return 0

    def access(self, path: str, amode: int) -> int:
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        blocks = 64 * 2**30 // BLOCK
        return {"f_bsize": BLOCK, "f_frsize": BLOCK, "f_blocks": blocks, "f_bfree": blocks, "f_bavail": blocks,
                "f_files": 10**6, "f_ffree": 10**6, "f_favail": 10**6, "f_namemax": 255}  # fmt: skip


def _err(code: int) -> OSError:
    from mfusepy import FuseOSError

    return FuseOSError(code)  # type: ignore[no-any-return]


# -- the helper tests use ----------------------------------------------------------------------------


def unavailable() -> str | None:
    """Why this machine cannot mount one (None: it can)."""
    if not Path("/dev/fuse").exists():
        return "no /dev/fuse on this machine"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as exc:
        return f"the FUSE binding (mfusepy) does not load: {exc}"
    if shutil.which("fusermount3") is None and shutil.which("fusermount") is None:
        return "fusermount is not installed (apt-get install fuse3)"
    return None


class PowerCutFS:
    """A power-cut filesystem mounted at `mount` by a child process."""

    def __init__(
        self,
        mount: Path,
        *,
        fsync_delay_ms: tuple[float, float] = (0.0, 0.0),
        journal: bool = False,
        cache: bool = False,
    ) -> None:
        self.mount = mount
        mount.mkdir(parents=True, exist_ok=True)
        delay = f"{fsync_delay_ms[0]}-{fsync_delay_ms[1]}"
        extra = (["--journal"] if journal else []) + (["--cache"] if cache else [])
        self.log = mount.with_name(mount.name + ".fuse.log")
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, __file__, str(mount), "--fsync-delay-ms", delay, *extra], stdout=out, stderr=out
            )
        deadline = time.monotonic() + 30
        while not (mount / CONTROL).exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"the power-cut filesystem did not mount: {self.log.read_text()[-2000:]}")
            time.sleep(0.05)  # polling for the mount (a condition with a deadline): FUSE gives no event

    def _say(self, words: str) -> None:
        fd = os.open(self.mount / CONTROL, os.O_WRONLY)
        try:
            os.write(fd, words.encode())
        finally:
            os.close(fd)

    def cut(self, *, tear: bool = False) -> None:
        """The power goes: nothing not fsync'd survives; every file call fails until `boot`."""
        self._say("cut tear" if tear else "cut")

    def freeze_on_cut(self, pid: int) -> None:
        """A cut stops this process first (SIGSTOP): it does nothing more on a dead disk."""
        self._say(f"freeze {pid}")

    def arm(self, call: str, pattern: str, n: int = 1, *, tear: bool = False) -> None:
        """Cut by itself at the n-th `call` ("write" or "fsync") to a file whose name matches `pattern`."""
        self._say(f"arm {call} {pattern} {n}{' tear' if tear else ''}")

    @property
    def dead(self) -> bool:
        """Whether the power is cut (by `cut` or an armed trigger)."""
        return bool(self.counters()["dead"])

    def boot(self) -> None:
        """Power back: what programs see is what was durable."""
        self._say("boot")

    def counters(self) -> dict[str, Any]:
        """Bytes written, writes, fsyncs, folder fsyncs, cuts so far; fsyncs per file name (`synced`)."""
        data: dict[str, Any] = json.loads((self.mount / CONTROL).read_bytes().split(b"\n", 1)[0])
        return data

    def reset_counters(self) -> None:
        """Counters from zero (a benchmark measures one phase)."""
        self._say("reset-counters")

    def close(self) -> None:
        """Unmount and end the child."""
        tool = shutil.which("fusermount3") or shutil.which("fusermount") or "fusermount3"
        subprocess.run([tool, "-u", "-z", str(self.mount)], capture_output=True, check=False)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def mounted(mount: Path, **kwargs: Any) -> Iterator[PowerCutFS]:
    """A power-cut filesystem for the `with` block."""
    fs = PowerCutFS(mount, **kwargs)
    try:
        yield fs
    finally:
        fs.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mount", type=Path)
    parser.add_argument("--fsync-delay-ms", default="0-0", help="every fsync takes A-B ms (slow flash)")
    parser.add_argument("--journal", action="store_true", help="ext4-like: an fsync makes every folder durable")
    parser.add_argument(
        "--cache",
        action="store_true",
        help="let the kernel cache reads (fast, as a real disk's page cache; only for mounts that are never cut: "
        "after a cut the cache would still hold what the disk forgot)",
    )
    args = parser.parse_args()
    low, _, high = args.fsync_delay_ms.partition("-")
    delay = (float(low) / 1000, float(high or low) / 1000)
    from mfusepy import FUSE

    timeout = 1.0 if args.cache else 0.0
    FUSE(
        PowerCutOps(delay, journal=args.journal), str(args.mount), foreground=True, nothreads=False, hard_remove=True,
        attr_timeout=timeout, entry_timeout=timeout, negative_timeout=0, default_permissions=False,
        kernel_cache=args.cache,
    )  # fmt: skip


if __name__ == "__main__":
    main()
