"""The spool's durability policy, in one place: when the writer commits, whether a commit is fsync'd, what is
trusted after a crash, and when the integrity check runs before start. How durable the spool is changes here
(and in the `spool.sync` key's description), nowhere else.

- **Commits** (`commit_wait_s`): a group commit once `spool.batch_max` unacknowledged results wait in memory
  or the oldest has waited `spool.batch_ms`, first wins; at once for a flush or changed counters; deletes and
  refusals within `batch_ms` of the first. Results acknowledged before their commit cost no commit at all: the
  replay window holds them in memory until a clean stop (window.py), so a healthy online device writes
  nothing.
- **fsync** (`synchronous`): `sync: full` fsyncs the WAL at every commit, so what status calls stored
  survives a power cut; `normal` only at checkpoints (a power cut can take back every commit since the last).
- **Trust after a crash** (`settled_marks_trusted`): the seq marks committed with the rows are trusted across
  a power cut only when every commit was fsync'd; otherwise the seq lease alone decides (seqlease.py).
- **The integrity check** (`check_before_start`): before start for a file up to CHECK_INLINE_BYTES or one not
  closed cleanly; in the background for a large file closed cleanly (recovery.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from edged.store.settings import SpoolConfig

CHECK_INLINE_BYTES = 64 * 2**20  # files up to this size are checked before start (about a second on a Pi)


@dataclass(frozen=True)
class Durability:
    """The policy for one spool, from its config."""

    fsync_every_commit: bool
    batch_s: float
    batch_max: int

    @classmethod
    def of(cls, cfg: SpoolConfig) -> Durability:
        return cls(cfg.sync == "full", cfg.batch_ms / 1000.0, cfg.batch_max)

    @property
    def synchronous(self) -> str:
        """SQLite's `PRAGMA synchronous` for every connection to the spool."""
        return "FULL" if self.fsync_every_commit else "NORMAL"

    @property
    def settled_marks_trusted(self) -> bool:
        """Whether the seq marks a commit saved are trusted after a power cut."""
        return self.fsync_every_commit

    @staticmethod
    def check_before_start(size: int, *, clean: bool) -> bool:
        """Whether the integrity check runs before the spool opens (else in the background)."""
        return size <= CHECK_INLINE_BYTES or not clean

    def commit_wait_s(
        self,
        *,
        urgent: bool,
        unacked: int,
        oldest_pending_age_s: float | None,
        changes_age_s: float | None,
    ) -> float | None:
        """0 when a commit is due now, else how long until one will be (None: nothing waits). `urgent`: a
        flush waits or the counters changed; `unacked`: unacknowledged results in memory; the ages: of the
        oldest of them, of the first delete or refusal not committed."""
        if urgent or unacked >= self.batch_max:
            return 0.0
        waits = []
        if oldest_pending_age_s is not None:
            waits.append(self.batch_s - oldest_pending_age_s)
        if changes_age_s is not None:
            waits.append(self.batch_s - changes_age_s)
        if not waits:
            return None
        return max(0.0, min(waits))
