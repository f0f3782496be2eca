"""What the ingest's replayer keeps per stream (fleet/seqbook.py) on its own: holes, their schedule, the bounds
that keep a fleet's worth of streams in little memory. Times are given, not waited for."""

from __future__ import annotations

import pytest

from edged.fleet import seqbook
from edged.fleet.replayer import clip, one_request
from edged.fleet.seqbook import HOLES_MAX, IDLE_S, SeqBook

KEY = ("dev1", "cam0")


def test_a_stream_seen_whole_costs_no_check() -> None:
    book = SeqBook(after_s=5.0, resolving=False)
    for seq in range(1, 1001):
        book.note(KEY, seq, now=0.0)
    assert book.wait_s(now=0.0) == IDLE_S  # nothing due: only the sweep of idle streams, much later
    assert book.unchecked() == 0


def test_a_hole_is_due_after_replay_after_s_and_a_late_row_fills_it() -> None:
    book = SeqBook(after_s=5.0, resolving=False)
    book.note(KEY, 1, now=0.0)
    book.note(KEY, 5, now=1.0)  # 2..4 not seen
    book.note(KEY, 3, now=2.0)  # a late row: 2 and 4 remain
    assert book.wait_s(now=2.0) == 4.0
    assert book.take_due(now=5.9).holes == {}
    turn = book.take_due(now=6.0)
    assert [(h.first, h.last) for h in turn.holes[KEY]] == [(2, 2), (4, 4)]


def test_holes_are_bounded_per_stream_by_merging_the_oldest() -> None:
    book = SeqBook(after_s=5.0, resolving=False)
    for seq in range(1, 4 * HOLES_MAX, 2):  # every other seq: what one of two shared ingests sees
        book.note(KEY, seq, now=0.0)
    st = book.streams[KEY]
    assert len(st.holes) == HOLES_MAX
    assert book.unchecked() >= 2 * HOLES_MAX - 1  # merged holes span seqs seen too: the check subtracts them


def test_an_idle_stream_is_forgotten_and_looked_up_again_when_it_returns() -> None:
    book = SeqBook(after_s=5.0, resolving=True)
    book.note(KEY, 1, now=0.0)
    book.take_due(now=5.0)  # its first look-up in the database
    assert book.wait_s(now=5.0) == IDLE_S - 5.0
    book.take_due(now=IDLE_S + 1.0)  # the sweep
    assert KEY not in book.streams
    assert book.counts.forgotten == 1
    book.note(KEY, 900, now=2 * IDLE_S + 2.0)  # back: where it was comes from the database
    turn = book.take_due(now=2 * IDLE_S + 7.0)
    assert turn.resolve == [("dev1", "cam0", 900)]


def test_streams_past_the_limit_forget_the_least_recently_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(seqbook, "STREAMS_MAX", 100)
    book = SeqBook(after_s=5.0, resolving=False)
    for i in range(150):
        book.note((f"dev{i}", "cam0"), 1, now=float(i))
    assert len(book.streams) == 100
    assert ("dev0", "cam0") not in book.streams
    assert ("dev149", "cam0") in book.streams


def test_one_request_asks_for_at_most_5000_seqs_in_64_ranges() -> None:
    asked, rest = one_request([(1, 4000), (5001, 7000)])
    assert asked == [(1, 4000), (5001, 6000)]
    assert rest == [(6001, 7000)]
    many = [(i * 10, i * 10) for i in range(1, 100)]
    asked, rest = one_request(many)
    assert (len(asked), len(rest)) == (64, 35)


def test_an_answer_is_believed_only_within_what_was_asked() -> None:
    assert clip([(1, 2**63 - 1)], [(100, 104), (200, 200)]) == [(100, 104), (200, 200)]
    assert clip([(1, 50)], [(100, 104)]) == []
