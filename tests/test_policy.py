"""The spool's durability policy (edged/store/policy.py) on its own: when a commit is due, fsync, what is
trusted after a power cut, when the integrity check runs before start."""

from __future__ import annotations

import pytest

from edged.store.policy import CHECK_INLINE_BYTES, Durability
from edged.store.settings import SpoolConfig

FULL = Durability.of(SpoolConfig(sync="full", batch_ms=1000, batch_max=128))


def wait(policy: Durability = FULL, **what: object) -> float | None:
    args: dict[str, object] = {"urgent": False, "unacked": 0, "oldest_pending_age_s": None,
                               "changes_age_s": None} | what  # fmt: skip
    return policy.commit_wait_s(**args)  # type: ignore[arg-type]


def test_sync_full_fsyncs_every_commit_and_trusts_the_marks_it_saved() -> None:
    normal = Durability.of(SpoolConfig(sync="normal"))
    assert (FULL.synchronous, FULL.settled_marks_trusted) == ("FULL", True)
    assert (normal.synchronous, normal.settled_marks_trusted) == ("NORMAL", False)


@pytest.mark.parametrize(
    ("size", "clean", "before"),
    [(1000, True, True), (CHECK_INLINE_BYTES + 1, True, False), (CHECK_INLINE_BYTES + 1, False, True)],
)
def test_a_large_spool_closed_cleanly_is_checked_in_the_background(size: int, clean: bool, before: bool) -> None:
    assert Durability.check_before_start(size, clean=clean) is before


def test_a_group_commit_comes_after_batch_ms_or_batch_max_whichever_first() -> None:
    assert wait() is None  # nothing waits: the writer sleeps
    assert wait(oldest_pending_age_s=0.25) == pytest.approx(0.75)
    assert wait(oldest_pending_age_s=0.25, unacked=128) == 0.0
    assert wait(oldest_pending_age_s=5.0) == 0.0  # overdue: at once, never a negative wait
    assert wait(changes_age_s=0.5, oldest_pending_age_s=0.1) == pytest.approx(0.5)  # the earlier deadline
    assert wait(urgent=True) == 0.0  # a flush, changed counters
