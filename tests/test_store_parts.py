"""The store's parts on their own, on real SQLite files: the outbox (what the next commit writes), the batch
writer (one commit, one transaction), eviction (TTL, `max_bytes` with `on_full`), recovery (what a crash
left), the gap log. The spool that wires them is tested in test_spool.py."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from edged.store import recovery, spooldb
from edged.store.batchwrite import BatchWriter
from edged.store.eviction import Totals, expire, make_room
from edged.store.gaplog import GAPS_KEPT, GapLog
from edged.store.outbox import Outbox
from edged.store.policy import Durability
from edged.store.seqlease import SeqGap
from edged.store.settings import SpoolConfig
from edged.store.spooldb import Row
from edged.store.spoolspace import SpaceGuard
from edged.store.window import RecentlySent, ReplayWindow


def row(i: int, seq: int, payload: bytes = b"{}") -> Row:
    return Row(i, "cam0/results", seq, 1.0, 1.0, "edged/dev/cam0/results", payload)


def test_the_outbox_hands_each_row_to_one_commit_and_an_early_ack_to_the_replay_window_only() -> None:
    recent = RecentlySent(window_s=60.0, max_bytes=1000)
    box = Outbox(next_id=1, dead_letter_after=2, recent=recent)
    for seq in (1, 2, 3):
        box.add(row(box.take_id(), seq))
    box.ack([3], clock=5.0)  # delivered before any commit: never written to results, held by the window's memory
    first = box.take_batch(batch_max=10)
    assert [r.seq for r in first.rows] == [1, 2]
    assert first.sent == []  # nothing for the window's table while the daemon runs: no write
    assert [r.seq for r in recent.rows("cam0/results", 1, 3)] == [3]
    assert not box.take_batch(batch_max=10)  # nothing new: rows in an open commit are not taken twice
    box.committed(first)
    box.ack([1])
    assert box.refuse(2, "too large") is False
    assert box.refuse(2, "too large") is True  # the second refusal makes it a dead letter
    second = box.take_batch(batch_max=10)
    assert (second.acks, second.dead) == ([1], {2: "too large"})


def test_one_commit_stores_the_batch_moves_acks_to_the_window_and_keeps_the_totals(tmp_path: Path) -> None:
    cfg = SpoolConfig(min_free_bytes=0, ballast_bytes=0)
    path = tmp_path / "spool.db"
    conn = spooldb.connect(path, Durability.of(cfg))
    window = ReplayWindow(cfg, conn)
    writer = BatchWriter(cfg, SpaceGuard(path, cfg), window, dead_letter_after=5)
    box = Outbox(next_id=1, dead_letter_after=5)
    for seq in (1, 2, 3):
        box.add(row(box.take_id(), seq, b"x" * 10))
    batch = box.take_batch(batch_max=10)
    after = writer.write(conn, Totals(), batch, keep=set(), marks={"cam0/results": 3}, clock=2.0, gaps=[])
    box.committed(batch)
    assert (after.depth, after.bytes) == (3, 30)
    box.ack([1, 2])
    acks = box.take_batch(batch_max=10)
    again = writer.write(conn, after, acks, keep=set(acks.acks), marks={}, clock=3.0, gaps=[])
    window.settle()
    state = spooldb.load_state(conn)  # what a restart reads: the same totals, the marks, the next id
    assert (again.depth, again.bytes) == (1, 10) == (state["depth"], state["bytes"])
    assert state["seqs"] == {"cam0/results": 3}
    assert state["next_id"] == 4
    assert window.snapshot(due=[])["rows"] == 2  # the acknowledged rows wait in the replay window


def test_the_gap_log_counts_a_gap_declared_twice_once_and_keeps_the_last_few() -> None:
    log = GapLog([])
    assert log.note([SeqGap("cam0/results", 10, 19)]) == 10
    assert log.note([SeqGap("cam0/results", 15, 24)]) == 5  # 15..19 were counted already
    for i in range(GAPS_KEPT + 5):
        log.note([SeqGap("cam1/results", 100 * i + 1, 100 * i + 2)])
    assert len(log.entries) == GAPS_KEPT


def stored(tmp_path: Path, rows: list[Row]) -> tuple[sqlite3.Connection, Totals]:
    conn = spooldb.connect(tmp_path / "spool.db", Durability.of(SpoolConfig()))
    spooldb.insert(conn, rows)
    return conn, Totals(depth=len(rows), bytes=sum(len(r.payload) for r in rows))


def test_the_ttl_and_a_full_spool_drop_rows_counted_by_reason(tmp_path: Path) -> None:
    old = [row(i, i, b"x" * 10)._replace(clock=float(i)) for i in (1, 2, 3)]
    conn, n = stored(tmp_path, old)
    expire(conn, n, cutoff=2.5, keep={1})  # rows before 2.5 on the spool clock go, unless an ack keeps them
    assert (n.depth, n.bytes, n.dropped) == (2, 20, {"expired": 1})
    new = [row(i, i, b"y" * 10) for i in (4, 5)]
    admitted = make_room(conn, new, n, keep=set(), cap=30, on_full="drop_oldest")
    assert [r.id for r in admitted] == [4, 5]
    assert n.dropped["full_evicted_oldest"] == 1  # 10 bytes of the oldest made room for 20
    refused = make_room(conn, [row(6, 6, b"z" * 50)], n, keep=set(), cap=30, on_full="drop_newest")
    assert (refused, n.dropped["full_rejected_newest"]) == ([], 1)


def test_recovery_checks_a_small_or_uncleanly_closed_spool_before_start(tmp_path: Path) -> None:
    path = tmp_path / "spool.db"
    policy = Durability.of(SpoolConfig())
    conn, moved, state, later = recovery.open_spool(path, policy)
    conn.close()
    assert (moved, state["depth"], later) == (None, 0, False)  # new, small: checked now, nothing to do later
    path.write_bytes(b"not a database" * 100)  # what a torn disk can leave
    conn, moved, state, later = recovery.open_spool(path, policy)
    conn.close()
    assert moved is not None  # moved aside for forensics; a fresh spool starts
    assert moved.exists()
    assert state["depth"] == 0


def test_the_window_s_memory_keeps_results_compressed_within_its_age_and_bytes() -> None:
    payload = json.dumps({"v": 1, "device": "pi-kitchen-01", "pipeline": "cam0", "provider": "CPUExecutionProvider",
                          "result": {"top": [{"index": 7, "label": "7", "score": 0.98}]}}).encode()  # fmt: skip
    recent = RecentlySent(window_s=100.0, max_bytes=len(payload) * 300)
    for seq in range(1, 401):
        recent.add(row(0, seq, payload), clock=float(seq) / 10)
    assert recent.bytes <= len(payload) * 300  # over its bytes: the oldest blocks went
    first, last = recent.span("cam0/results") or (0, 0)
    assert last == 400
    assert first > 100
    assert [r.seq for r in recent.rows("cam0/results", 390, 395)] == list(range(390, 396))
    assert recent.rows("cam0/results", 390, 390)[0].payload == payload  # the same bytes back
    assert recent.memory_bytes < recent.bytes / 4  # blocks of JSON results compress
    recent.trim(clock=40.0 + 100.0 - 0.05)  # acknowledged more than 100 s before: whole blocks out
    assert (recent.span("cam0/results") or (0, 0))[0] > first
    assert recent.span("cam1/results") is None
    everything = recent.take_all()
    assert [r.seq for r in everything] == sorted(r.seq for r in everything)  # oldest first, for the table
    assert (len(recent), recent.bytes) == (0, 0)


def test_a_replayed_result_never_enters_the_window_again() -> None:
    """A consumer that asks for the same seqs over and over cannot push other results out of the window."""
    recent = RecentlySent(window_s=60.0, max_bytes=10**6)
    box = Outbox(next_id=1, dead_letter_after=2, recent=recent)
    first = row(box.take_id(), 1)
    box.add(first)
    box.ack([first.id], clock=1.0)
    for _ in range(20):
        box.add_again(recent.rows("cam0/results", 1, 1))
        again = box.live_after(0, 10)
        box.ack([r.id for r in again], clock=2.0)
    assert len(recent) == 1
    assert recent.rows("cam0/results", 1, 1)[0].clock == 1.0  # still the first acknowledgement's entry
    assert box.replays == set()
