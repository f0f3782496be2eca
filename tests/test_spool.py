"""Spool: real SQLite files; batching, seq persistence, ack-only deletion, writer thread stop."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from edged.errors import SpoolError
from edged.spool import Spool


def add(spool: Spool, pipeline: str, n: int) -> list[int]:
    seqs = []
    for _ in range(n):
        seq = spool.next_seq(pipeline)
        spool.append(pipeline, seq, 1000.0 + seq, f"t/{pipeline}", f'{{"seq":{seq}}}'.encode())
        seqs.append(seq)
    return seqs


def count_rows(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM results").fetchone()[0])


def test_commits_in_batches_of_batch_max(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db", batch_max=10, batch_ms=60_000)
    spool.start()
    add(spool, "a", 25)
    commits = spool.wait_for_commit(0, 10)
    commits = spool.wait_for_commit(commits, 10) if commits < 2 else commits
    assert commits == 2
    assert count_rows(tmp_path / "s.db") == 20  # the last 5 wait for the timer or a flush
    assert spool.flush()
    assert count_rows(tmp_path / "s.db") == 25
    spool.close()


def test_commits_a_partial_batch_when_batch_ms_passes(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db", batch_max=1000, batch_ms=20)
    spool.start()
    add(spool, "a", 3)
    assert spool.wait_for_commit(0, 10) == 1
    assert count_rows(tmp_path / "s.db") == 3
    spool.close()


def test_wal_mode_and_sync_setting(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db", sync="full")
    assert spool._wconn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert spool._wconn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    spool.close()


def test_seq_continues_after_restart_even_when_everything_was_delivered(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db", batch_ms=0)
    spool.start()
    assert add(spool, "cam0", 3) == [1, 2, 3]
    add(spool, "cam1", 1)
    spool.flush()
    spool.ack([r.id for r in spool.fetch(0, 100)])
    spool.flush()
    spool.close()
    assert count_rows(tmp_path / "s.db") == 0
    again = Spool(tmp_path / "s.db")
    assert again.next_seq("cam0") == 4
    assert again.next_seq("cam1") == 2
    assert again.next_seq("new") == 1
    again.close()


def test_fetch_is_oldest_first_and_ack_removes_only_acked_rows(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db", batch_ms=0)
    spool.start()
    add(spool, "a", 5)
    spool.flush()
    rows = spool.fetch(0, 10)
    assert [r.seq for r in rows] == [1, 2, 3, 4, 5]
    spool.ack([rows[0].id, rows[2].id])
    assert [r.seq for r in spool.fetch(0, 10)] == [2, 4, 5]  # acked rows are not sent again
    assert [r.seq for r in spool.fetch(rows[1].id, 10)] == [4, 5]
    spool.flush()
    assert spool.depth == 3
    assert spool.stats()["depth"] == 3
    spool.close()
    with sqlite3.connect(tmp_path / "s.db") as conn:
        assert [r[0] for r in conn.execute("SELECT seq FROM results ORDER BY id")] == [2, 4, 5]


def test_rows_left_at_close_are_there_after_reopen(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db", batch_max=1000, batch_ms=60_000)
    spool.start()
    add(spool, "a", 7)
    spool.close()  # commits what is queued
    again = Spool(tmp_path / "s.db")
    assert again.depth == 7
    assert again.stats()["bytes"] == sum(len(f'{{"seq":{i}}}') for i in range(1, 8))
    again.close()


def test_writer_thread_has_a_name_and_stops_on_close(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db")
    spool.start()
    assert any(t.name == "edged-spool-writer" for t in threading.enumerate())
    spool.close()
    assert not any(t.name == "edged-spool-writer" for t in threading.enumerate())
    with pytest.raises(SpoolError, match="spool is closed"):
        spool.append("a", 1, 0.0, "t", b"x")


def test_unwritable_state_dir_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory", encoding="utf-8")
    with pytest.raises(SpoolError, match="check that state_dir is writable"):
        Spool(blocker / "s.db")
