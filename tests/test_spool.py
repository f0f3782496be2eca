"""Spool: real SQLite files; batching, seq persistence, ack-only deletion, writer thread stop."""

from __future__ import annotations

import json
import random
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from conftest import wait_for

from edged.core.errors import SpoolError
from edged.core.recent import Recent
from edged.store.policy import Durability
from edged.store.seqlease import LEASE_MAX, LEASE_MIN, SeqAllocator, SeqGap
from edged.store.spool import Spool, SpoolConfig


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
    spool = Spool(tmp_path / "s.db", SpoolConfig(batch_max=10, batch_ms=60_000))
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
    spool = Spool(tmp_path / "s.db", SpoolConfig(batch_max=1000, batch_ms=20))
    spool.start()
    add(spool, "a", 3)
    assert spool.wait_for_commit(0, 10) == 1
    assert count_rows(tmp_path / "s.db") == 3
    spool.close()


def test_wal_mode_and_sync_setting(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db", SpoolConfig(sync="full"))
    conn = spool.writer.conn  # synchronous is a setting of the writer's own connection
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    spool.close()


def test_seq_continues_after_restart_even_when_everything_was_delivered(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db", SpoolConfig(batch_ms=0))
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
    spool = Spool(tmp_path / "s.db", SpoolConfig(batch_ms=0))
    spool.start()
    add(spool, "a", 5)
    spool.flush()
    rows = spool.fetch(0, 10)
    assert [r.seq for r in rows] == [1, 2, 3, 4, 5]
    spool.ack([rows[0].id, rows[2].id])
    assert [r.seq for r in spool.fetch(0, 10)] == [2, 4, 5]  # acked rows are not sent again
    assert [r.seq for r in spool.fetch(rows[1].id, 10)] == [4, 5]
    assert [r.seq for r in spool.fetch(rows[2].id, 10)] == [4, 5]  # every acked row behind the cursor
    spool.flush()
    assert [r.seq for r in spool.fetch(0, 10)] == [2, 4, 5]
    assert spool.depth == 3
    assert spool.stats()["depth"] == 3
    spool.close()
    with sqlite3.connect(tmp_path / "s.db") as conn:
        assert [r[0] for r in conn.execute("SELECT seq FROM results ORDER BY id")] == [2, 4, 5]


def test_rows_left_at_close_are_there_after_reopen(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db", SpoolConfig(batch_max=1000, batch_ms=60_000))
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


# -- policies ---------------------------------------------------------------------------------------------


def policy_spool(tmp_path: Path, dead_letter_after: int = 5, **limits: object) -> Spool:
    settings = {"batch_ms": 0, "min_free_bytes": 0, "ballast_bytes": 0, **limits}
    spool = Spool(tmp_path / "s.db", SpoolConfig.model_validate(settings), dead_letter_after=dead_letter_after)
    spool.start()
    return spool


def add_sized(spool: Spool, n: int, size: int = 100) -> None:
    for _ in range(n):
        seq = spool.next_seq("p")
        spool.append("p", seq, 0.0, "t", str(seq).encode().ljust(size, b" "))
    assert spool.flush()


@pytest.mark.parametrize(("policy", "kept"), [("drop_oldest", range(11, 21)), ("drop_newest", range(1, 11))])
def test_max_bytes_applies_the_on_full_policy_and_counts_every_drop(tmp_path: Path, policy: str, kept: range) -> None:
    spool = policy_spool(tmp_path, max_bytes=1000, on_full=policy)
    add_sized(spool, 20)  # 2000 bytes into a 1000-byte spool
    assert [r.seq for r in spool.fetch(0, 100)] == list(kept)
    stats = spool.stats()
    assert stats["depth"] == 10
    assert stats["bytes"] == 1000
    reason = "full_evicted_oldest" if policy == "drop_oldest" else "full_rejected_newest"
    assert stats["dropped_by_reason"] == {reason: 10}
    assert stats["dropped"] == 10
    spool.close()
    again = Spool(tmp_path / "s.db")  # counters survive a restart
    assert again.stats()["dropped_by_reason"] == {reason: 10}
    assert again.next_seq("p") == 21  # dropped results' seqs are never handed out again
    again.close()


def test_ttl_runs_on_a_clock_that_ignores_wall_clock_jumps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spool = policy_spool(tmp_path, max_age=3600)
    add_sized(spool, 3)
    # the wall clock jumps 50 years ahead (a Pi without RTC booting in 1970, then NTP): nothing expires
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + 50 * 365 * 86400)
    add_sized(spool, 1)
    assert spool.stats()["depth"] == 4
    # the spool clock moving past the TTL does expire them (stands in for an hour of running)
    monkeypatch.setattr(spool.ledger, "_clock_base", spool.ledger._clock_base + 3601)  # noqa: SLF001  (an hour passes)
    add_sized(spool, 1)
    stats = spool.stats()
    assert stats["dropped_by_reason"] == {"expired": 4}
    assert [r.seq for r in spool.fetch(0, 10)] == [5]
    spool.close()


def test_the_spool_clock_persists_across_restarts(tmp_path: Path) -> None:
    spool = policy_spool(tmp_path)
    spool.ledger._clock_base = 1000.0  # noqa: SLF001  (the spool clock, set to a known value)
    add_sized(spool, 1)
    spool.close()
    again = Spool(tmp_path / "s.db")
    assert again.clock() >= 1000.0
    again.close()


def test_refused_rows_go_to_dead_letters_after_n_tries(tmp_path: Path) -> None:
    spool = policy_spool(tmp_path, dead_letter_after=3)
    add_sized(spool, 2)
    bad = spool.fetch(0, 1)[0]
    for _ in range(2):
        spool.refuse(bad.id, "Packet too large")
        spool.flush()
        assert spool.depth == 2
    spool.refuse(bad.id, "Packet too large")
    spool.flush()
    assert [r.seq for r in spool.fetch(0, 10)] == [2]
    assert spool.stats()["dead_letters"] == 1
    spool.close()
    with sqlite3.connect(tmp_path / "s.db") as conn:
        assert conn.execute("SELECT seq, tries, reason FROM dead_letters").fetchall() == [(1, 3, "Packet too large")]


def test_capacity_shrinks_to_the_free_disk_space(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from edged.store import spoolspace

    spool = policy_spool(tmp_path, max_bytes=10**9, min_free_bytes=500)
    monkeypatch.setattr(spoolspace, "free_bytes", lambda _p: 1200)  # the disk is nearly full
    add_sized(spool, 10)  # 1000 bytes, but only 700 may be used
    stats = spool.stats()
    assert 0 < stats["bytes"] <= 700
    assert stats["dropped_by_reason"]["full_evicted_oldest"] == 10 - stats["depth"]
    assert stats["space_warning"] is None  # min_free_bytes is kept: nothing to warn about
    spool.close()


def test_a_disk_smaller_than_min_free_bytes_still_buffers_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edged.store import spoolspace

    spool = policy_spool(tmp_path, max_bytes=10**9, min_free_bytes=64 * 2**20)
    monkeypatch.setattr(spoolspace, "free_bytes", lambda _p: 3000)  # 3 kB free, 64 MiB asked for
    add_sized(spool, 10)
    stats = spool.stats()
    assert stats["depth"] == 10  # half of what there is: the working set still fits
    assert stats["max_bytes"] > 0
    assert "disk too small for spool.min_free_bytes" in stats["space_warning"]
    spool.close()


def test_a_drained_backlog_gives_its_room_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from edged.store import spoolspace

    spool = policy_spool(tmp_path, max_bytes=10**9, min_free_bytes=0)
    add_sized(spool, 2000, size=1000)  # ~2 MB in the file
    spool.ack([r.id for r in spool.fetch(0, 5000)])
    assert spool.flush()
    # the filesystem is now full: only what SQLite holds but no longer uses is room
    monkeypatch.setattr(spoolspace, "free_bytes", lambda _p: 0)
    add_sized(spool, 100, size=1000)
    stats = spool.stats()
    assert stats["depth"] == 100  # the freed pages count as room: nothing was dropped
    assert stats["dropped"] == 0
    spool.close()


def test_a_damaged_database_is_moved_aside_and_seq_keeps_increasing(tmp_path: Path) -> None:
    spool = policy_spool(tmp_path)
    add_sized(spool, 50, size=200)
    spool.close()
    db = tmp_path / "s.db"
    data = bytearray(db.read_bytes())
    rng = random.Random(7)
    for page in range(1, len(data) // 4096):  # random bytes over every page but the header page
        for _ in range(64):
            data[page * 4096 + rng.randrange(4096)] = rng.randrange(256)
    db.write_bytes(bytes(data))
    again = Spool(db)
    assert again.recovered_from is not None
    assert again.recovered_from.name.startswith("s.db.corrupt-")
    assert again.recovered_from.exists()
    assert again.stats()["recovered_from"] == str(again.recovered_from)
    assert again.depth == 0
    assert again.next_seq("p") > 50  # never a seq that was handed out before
    again.close()


def test_a_quarantined_file_s_unsent_rows_are_counted_and_its_counters_survive(tmp_path: Path) -> None:
    """Finding 5: rows abandoned in a quarantined file were never counted, and the drop counters reset.
    The damage here is targeted (the dead_letters table's root page), so the rest of the file can be read."""
    spool = policy_spool(tmp_path, max_bytes=2000)
    add_sized(spool, 30, size=200)  # the bound keeps about 10: 20 evicted, counted
    before = spool.stats()
    spool.close()
    assert before["depth"] > 0
    assert before["dropped_by_reason"]["full_evicted_oldest"] > 0
    db = tmp_path / "s.db"
    with sqlite3.connect(db) as conn:
        (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'dead_letters'").fetchone()
        page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
    conn.close()
    data = bytearray(db.read_bytes())
    data[(root - 1) * page_size + (100 if root == 1 else 0)] = 0xFF  # an impossible b-tree page type
    db.write_bytes(bytes(data))
    again = Spool(db)
    try:
        assert again.recovered_from is not None
        dropped = again.stats()["dropped_by_reason"]
        assert dropped["quarantined"] == before["depth"]  # the unsent rows, counted
        assert dropped["full_evicted_oldest"] == before["dropped_by_reason"]["full_evicted_oldest"]  # carried over
        assert again.next_seq("p") == 31  # seq continues after the damaged file's
        again.start()
        again.append("p", 31, 0.0, "t", b"after")  # aftermath: the fresh file buffers
        assert again.flush()
        assert again.depth == 1
    finally:
        again.close()


def test_a_truncated_wal_loses_at_most_the_torn_commit(tmp_path: Path) -> None:
    spool = policy_spool(tmp_path)
    add_sized(spool, 30)
    wal = tmp_path / "s.db-wal"
    # copy the database as a crash would leave it: main file plus a WAL cut in the middle
    crash = tmp_path / "crash"
    crash.mkdir()
    (crash / "s.db").write_bytes((tmp_path / "s.db").read_bytes())
    (crash / "s.db-wal").write_bytes(wal.read_bytes()[: wal.stat().st_size // 2])
    spool.close()
    again = Spool(crash / "s.db")
    assert again.recovered_from is None
    seqs = [r.seq for r in again.fetch(0, 100)]
    assert seqs == list(range(1, len(seqs) + 1))  # a prefix: no gap, nothing invented
    again.close()


# -- publish before commit, seq leases ------------------------------------------------------------------


def test_a_result_acknowledged_before_its_commit_is_never_written(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db", SpoolConfig(batch_ms=60_000))
    spool.start()
    add(spool, "a", 3)
    live = spool.fetch(0, 10)
    assert [r.seq for r in live] == [1, 2, 3]  # visible to the publisher before any commit
    spool.ack([live[0].id, live[1].id])  # the broker was quick for two of them
    assert spool.depth == 1
    assert spool.flush()
    assert count_rows(tmp_path / "s.db") == 1  # only the unacknowledged one reached the disk
    assert [r.seq for r in spool.fetch(0, 10)] == [3]
    assert spool.stats()["acked_before_commit"] == 2
    spool.close()


def test_a_result_never_acknowledged_is_committed_within_the_window(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db", SpoolConfig(batch_ms=20, batch_max=1000))
    spool.start()
    add(spool, "a", 2)
    assert spool.wait_for_commit(0, 10) >= 1
    assert count_rows(tmp_path / "s.db") == 2
    row = spool.fetch(0, 10)[0]
    spool.ack([row.id])  # acknowledged after its commit: deleted
    assert spool.flush()
    assert count_rows(tmp_path / "s.db") == 1
    spool.close()


def crash_copy(tmp_path: Path, name: str) -> Path:
    """The state dir as kill -9 would leave it (the files as they are, nothing closed)."""
    crash = tmp_path / name
    crash.mkdir()
    for f in tmp_path.iterdir():
        if f.is_file() and f.name.startswith("s.db"):
            (crash / f.name).write_bytes(f.read_bytes())
    return crash / "s.db"


@pytest.mark.integration
def test_a_crash_between_publish_and_commit_never_reuses_a_seq(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db", SpoolConfig(batch_ms=60_000))
    spool.start()
    add(spool, "a", 5)
    spool.ack([r.id for r in spool.fetch(0, 10)])  # published from memory, acknowledged, never committed
    db = crash_copy(tmp_path, "crash")  # kill -9 now
    spool.close()
    again = Spool(db)
    assert again.next_seq("a") > 5  # 1..5 reached the broker: none of them is handed out again
    (gap,) = again.stats()["seq_gaps"]
    assert gap["first"] == 1
    # uncertain, not dropped: 1..5 were delivered, the rest of the lease never used; nobody can tell which
    assert again.stats()["uncertain"] == gap["last"] - gap["first"] + 1
    assert "unclean_stop" not in again.stats()["dropped_by_reason"]
    again.close()
    clean = Spool(db)  # after a clean stop numbering goes on without a gap
    last = clean.next_seq("a")
    clean.close()
    assert Spool(db).next_seq("a") == last + 1


def test_seq_survives_a_rolled_back_wal(tmp_path: Path) -> None:
    spool = policy_spool(tmp_path)
    add_sized(spool, 30)
    db = crash_copy(tmp_path, "crash")
    (db.parent / "s.db-wal").write_bytes(b"")  # the whole WAL lost: the seqs table rolls back
    spool.close()
    again = Spool(db)
    assert again.next_seq("p") > 30
    again.close()


@pytest.mark.integration
def test_a_locked_database_is_waited_for_and_never_moved_aside(tmp_path: Path) -> None:
    from edged.store import spooldb

    spool = policy_spool(tmp_path)
    add_sized(spool, 5)
    spool.close()
    db = tmp_path / "s.db"
    (tmp_path / "s.db.seqfloor").unlink()  # an unclean stop: the check runs
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(SpoolError, match="locked by another process"):
            spooldb.open_checked(db, Durability.of(SpoolConfig(sync="normal")), lock_wait_s=0.5)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert not list(tmp_path.glob("s.db.corrupt-*"))  # a busy database is not a damaged one
    again = Spool(db)
    assert again.depth == 5
    again.close()


def test_a_refusal_counts_at_once_and_a_dead_letter_is_never_sent_again(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db", SpoolConfig(batch_ms=60_000, ballast_bytes=0), dead_letter_after=3)
    spool.start()
    add(spool, "a", 2)
    bad = spool.fetch(0, 1)[0]
    assert not spool.refuse(bad.id, "Packet too large")
    assert not spool.refuse(bad.id, "Packet too large")
    assert spool.refuse(bad.id, "Packet too large")  # the third: dead now, before any commit
    assert [r.seq for r in spool.fetch(0, 10)] == [2]
    assert spool.flush()
    assert spool.stats()["dead_letters"] == 1
    spool.close()


def test_a_row_that_can_never_be_sent_is_a_dead_letter_at_once(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db", SpoolConfig(batch_ms=60_000, ballast_bytes=0), dead_letter_after=5)
    spool.start()
    add(spool, "a", 2)
    bad = spool.fetch(0, 1)[0]
    assert spool.refuse(bad.id, "invalid topic", final=True)
    assert [r.seq for r in spool.fetch(0, 10)] == [2]
    assert spool.flush()
    spool.close()
    with sqlite3.connect(tmp_path / "s.db") as conn:
        assert conn.execute("SELECT seq, tries FROM dead_letters").fetchall() == [(1, 5)]


@pytest.mark.integration
def test_a_gap_after_a_crash_starts_where_certainty_ends(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db", SpoolConfig(batch_ms=60_000))
    spool.start()
    add(spool, "a", 10)
    assert spool.flush()  # 1..10 committed: certain
    add(spool, "a", 5)  # 11..15 in memory only
    db = crash_copy(tmp_path, "crash")
    spool.close()
    again = Spool(db)
    (gap,) = again.stats()["seq_gaps"]
    # the uncommitted ones and the rest of the lease are uncertain, nothing before
    assert gap["first"] == 11
    assert 15 < gap["last"] <= 15 + LEASE_MAX
    assert again.stats()["uncertain"] == gap["last"] - 10
    assert again.next_seq("a") == gap["last"] + 1
    again.close()


def test_results_acknowledged_from_memory_are_certain_once_a_lease_write_recorded_them(tmp_path: Path) -> None:
    settled = {"a": 0}  # the spool's answer: here every seq is acknowledged as soon as it is handed out
    seqs = SeqAllocator(tmp_path / "lease", {}, settled=lambda: dict(settled))  # no renewer: writes in next()
    for _ in range(LEASE_MIN + 4):  # the second lease is written when 17 is handed out
        settled["a"] = seqs.next("a")
    again = SeqAllocator(tmp_path / "lease", {})  # kill -9 now: the database never saw a commit
    (gap,) = again.gaps
    assert gap.first == LEASE_MIN + 1  # 1..16 were settled (acknowledged) when the lease for 17 was written
    assert gap.used_to == LEASE_MIN  # handed out for sure by then; beyond, perhaps never used


def test_the_lease_grows_to_about_ten_seconds_of_the_rate(tmp_path: Path) -> None:
    seqs = SeqAllocator(tmp_path / "lease", {})
    for _ in range(5000):  # far faster than 100 per second: every lease is as large as allowed
        seqs.next("a")
    lease = json.loads((tmp_path / "lease").read_text())["lease"]["a"]
    assert 5000 < lease <= 5000 + LEASE_MAX


def test_a_torn_lease_file_skips_the_largest_lease_and_says_so(tmp_path: Path) -> None:
    (tmp_path / "lease").write_text('{"v": 3, "clean": fal', encoding="utf-8")  # torn by a cut
    seqs = SeqAllocator(tmp_path / "lease", {"a": 41})
    assert seqs.gaps == [SeqGap("a", 42, 41 + LEASE_MAX, 41)]  # uncertain, declared: never a reuse
    assert seqs.next("a") == 42 + LEASE_MAX


def test_the_lease_is_renewed_ahead_on_its_own_thread_which_stops_with_the_spool(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db")
    spool.start()
    renewer = spool.seqs.renewer
    assert renewer is not None
    assert renewer.name == "edged-seq-lease"
    add(spool, "a", LEASE_MIN)  # past half of the first lease: the renewer extends it ahead
    lease = tmp_path / "s.db.seqfloor"
    wait_for(lambda: json.loads(lease.read_text())["lease"]["a"] > LEASE_MIN, 10, "the lease renewed ahead")
    spool.close()
    assert not renewer.is_alive()


def test_recent_growth_is_a_pure_read_of_what_was_noted() -> None:
    """The status reasons' "in the last 60 s" figures: reading them changes nothing; a total that grew inside
    the window counts, one that grew before it does not."""
    recent = Recent(window_s=3600.0, total=5)
    assert recent.growth() == 0
    recent.note(5)  # unchanged: nothing
    recent.note(9)
    assert [recent.growth() for _ in range(3)] == [4, 4, 4]
    old = Recent(window_s=0.0, total=5)
    old.note(9)  # a window of nothing: what grew is already outside it
    assert old.growth() == 0


def test_the_replay_window_costs_no_write_while_running_and_survives_a_clean_stop(tmp_path: Path) -> None:
    """Results acknowledged before their commit are held in memory for replay: no commit, no row in `sent`;
    a clean stop writes them into the table, and the next start can still send them again."""
    path = tmp_path / "s.db"
    spool = Spool(path, SpoolConfig(batch_ms=60_000))
    spool.start()
    add(spool, "cam0", 4)
    spool.ack([r.id for r in spool.fetch(0, 10)])  # acknowledged straight from memory
    window = spool.stats()["replay_window"]
    assert (window["rows"], window["memory_rows"]) == (4, 4)
    assert spool.flush()
    assert spool.writer.commits == 0  # nothing was due: the flash saw nothing of the four results
    rows, _ = spool.replay.window_rows("cam0", 1, 4, 4)
    assert [r.seq for r in rows] == [1, 2, 3, 4]
    spool.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT seq FROM sent ORDER BY seq").fetchall() == [(1,), (2,), (3,), (4,)]
    again = Spool(path, SpoolConfig(batch_ms=60_000))
    again.start()
    assert again.stats()["replay_window"]["rows"] == 4
    rows, _ = again.replay.window_rows("cam0", 2, 3, 10)
    assert [r.seq for r in rows] == [2, 3]
    assert again.replay.window_span("cam0") == [1, 4]
    again.close()


def test_a_crash_costs_the_window_s_memory_and_nothing_else(tmp_path: Path) -> None:
    """kill -9 while results are held in the window's memory: they were delivered and are gone from the window
    (answered `gone` to a request); the spool, the seqs and what was not delivered are as before."""
    path = tmp_path / "s.db"
    spool = Spool(path, SpoolConfig(batch_ms=0))
    spool.start()
    add(spool, "cam0", 3)
    spool.ack([r.id for r in spool.fetch(0, 10)][:2])  # seq 3 is not acknowledged: it is committed
    assert spool.flush()
    copy = crash_copy(tmp_path, "crash.db")  # the files as kill -9 would leave them
    spool.close()
    after = Spool(copy, SpoolConfig(batch_ms=0))
    after.start()
    rows, waiting = after.replay.window_rows("cam0", 1, 3, 10)
    assert (rows, waiting) == ([], [3])
    assert after.next_seq("cam0") > 3
    after.close()
