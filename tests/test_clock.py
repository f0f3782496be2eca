"""Time you can trust (core/clock.py): a clock no time service vouches for flags what is captured, with what
corrects it; a synchronization corrects results still in the spool on their way out and, through the clock
message, those already sent (edged ingest).

The wall clock of this machine cannot be stepped for a test (every other process would see it), so the
daemon's own clock is faked with libfaketime from Debian (LD_PRELOAD; its file is read again at every call,
so a test steps it by rewriting the file). CLOCK_BOOTTIME stays real (DONT_FAKE_MONOTONIC), as on a device.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import Broker, StartDaemon, base_config, make_video, wait_for, write_config

from edged.config import parse_config
from edged.core.clock import ClockConfig, ClockWatch, ask, boot_id, boottime
from edged.core.errors import ConfigError
from edged.fleet.ingest import Ingest, IngestOptions
from edged.fleet.ingestdb import open_database

REAL_NOW = 1.7e9  # any time before this is not "now" (the test machine's clock is past 2023)


def _libfaketime() -> str:
    found = sorted(Path("/usr/lib").glob("*/faketime/libfaketimeMT.so.1"))
    if not found:
        pytest.fail("libfaketime is not installed; the README's test command installs it (apt-get install faketime)")
    return str(found[0])


def _faked(spec_file: Path) -> dict[str, str]:
    """The environment that runs a process on the clock `spec_file` says (libfaketime's syntax)."""
    return {
        **os.environ,
        "LD_PRELOAD": _libfaketime(),
        "FAKETIME_TIMESTAMP_FILE": str(spec_file),
        "FAKETIME_NO_CACHE": "1",  # read the file at every call: rewriting it steps the clock at once
        "DONT_FAKE_MONOTONIC": "1",  # CLOCK_MONOTONIC and CLOCK_BOOTTIME stay real, as on a device
        "NO_FAKE_STAT": "1",  # file times as they are (the model file's poll must not see a change)
    }


def _result(ts: float, watch: ClockWatch) -> bytes:
    stamp = watch.stamp(ts)
    assert stamp is not None
    return json.dumps({"v": 1, "seq": 1, "ts": ts, "result": {}, "clock": stamp.fields()},
                      separators=(",", ":")).encode()  # fmt: skip


# -- the watch, on a flag file --------------------------------------------------------------------------------


def test_a_clock_no_service_vouches_for_flags_frames_and_its_synchronization_corrects_them(tmp_path: Path) -> None:
    flag = tmp_path / "synchronized"
    watch = ClockWatch(ClockConfig(sync="file", file=flag), tmp_path)
    watch.check()
    assert not watch.synced
    assert watch.describe()["detail"] == f"{flag} does not exist"
    ts = round(time.time(), 3)  # as a result message has it
    payload = _result(ts, watch)
    clock = json.loads(payload)["clock"]
    assert clock["boot"] == boot_id() != ""
    assert abs(clock["mono"] - boottime()) < 1.0
    assert watch.correct(payload) == payload  # not synchronized yet: it goes as it was stamped

    flag.touch()
    watch.check()
    assert watch.describe()["state"] == "synchronized"
    assert [c["boot"] for c in watch.corrections] == [boot_id()]
    fixed = json.loads(watch.correct(payload))
    assert fixed["clock"] == {**clock, "corrected": True, "ts_original": ts}
    assert abs(fixed["ts"] - ts) < 0.05  # this machine's clock did not step: the true time is the stamped one
    assert watch.stamp(time.time()) is None  # trusted now: nothing to flag
    again = ClockWatch(ClockConfig(sync="file", file=flag), tmp_path)  # a restart keeps what consumers need
    assert again.corrections == watch.corrections


def test_frames_flagged_by_an_earlier_run_of_this_boot_get_their_correction_from_the_next_run(tmp_path: Path) -> None:
    flag = tmp_path / "synchronized"
    first = ClockWatch(ClockConfig(sync="file", file=flag), tmp_path)
    first.check()
    assert first.stamp(time.time()) is not None  # then it stopped, before the clock was synchronized
    flag.touch()
    second = ClockWatch(ClockConfig(sync="file", file=flag), tmp_path)
    second.check()
    assert second.describe()["state"] == "synchronized"
    assert len(second.corrections) == 1
    third = ClockWatch(ClockConfig(sync="file", file=flag), tmp_path)
    third.check()
    assert len(third.corrections) == 1  # nothing flagged since: no new correction


TORN_CLOCK_FILES = ["", "{", "[]", '{"corrections": 5, "pending": [1]}',
                    '{"corrections": [{"boot": 1}, "x", {"boot": "b", "mono": 1, "offset": 2}]}']  # fmt: skip


@pytest.mark.parametrize("text", TORN_CLOCK_FILES)
def test_a_torn_or_foreign_clock_file_is_read_as_what_can_be_trusted_of_it(tmp_path: Path, text: str) -> None:
    (tmp_path / "clock.json").write_text(text, encoding="utf-8")
    watch = ClockWatch(ClockConfig(sync="assume"), tmp_path)
    watch.check()
    assert watch.corrections in ([], [{"boot": "b", "mono": 1, "offset": 2}])


def test_another_boot_s_stamp_and_a_foreign_payload_go_out_as_they_are(tmp_path: Path) -> None:
    watch = ClockWatch(ClockConfig(sync="assume"), tmp_path)
    watch.check()
    other = b'{"ts":5.0,"clock":{"synced":false,"boot":"another-boot","mono":3.0}}'
    torn = b'{"ts":5.0,"clock":{"synced":false,"boot":'
    assert watch.correct(other) == other
    assert watch.correct(torn) == torn
    assert watch.correct(b'{"ts":5.0}') == b'{"ts":5.0}'


def test_each_time_service_is_asked_as_configured(tmp_path: Path) -> None:
    assert ask(ClockConfig(sync="assume"))[0] is True
    assert ask(ClockConfig(sync="command", command=["true"])) == (True, "the command true exited 0")
    assert ask(ClockConfig(sync="command", command=["false"])) == (False, "the command false exited 1")
    synced, detail = ask(ClockConfig(sync="command", command=[str(tmp_path / "missing")]))
    assert not synced
    assert "failed" in detail
    synced, detail = ask(ClockConfig(sync="kernel"))  # this machine's own verdict, whatever it is
    assert detail.startswith("the kernel's time status")
    assert ask(ClockConfig(sync="auto", file=tmp_path / "flag"))[0] is synced


def test_a_command_sync_without_its_command_is_a_config_error_with_the_line() -> None:
    text = "device_id: d\nclock:\n  sync: command\npipelines: [{name: a, source: {uri: /dev/v0}, model: {path: m}}]\n"
    with pytest.raises(ConfigError) as err:
        parse_config(text, "edged.yaml")
    assert 'edged.yaml:2 clock={"sync": "command"}: sync: command needs command: [argv...]' in err.value.problems


def test_a_step_of_the_wall_clock_is_seen_at_the_next_frame_and_distrusts_it_until_the_service_confirms(
    tmp_path: Path,
) -> None:
    """A real step, of a real process's clock (libfaketime): the frame after it is flagged, the step counted;
    the check the step asks for does not trust the clock while the flag file is the one from before the step,
    and trusts it with the new offset once the time service wrote the file again."""
    spec = tmp_path / "faketime"
    spec.write_text("+0\n", encoding="utf-8")
    flag = tmp_path / "synchronized"
    flag.touch()
    script = textwrap.dedent(f"""
        import json, time
        from pathlib import Path
        from edged.core.clock import ClockConfig, ClockWatch
        watch = ClockWatch(ClockConfig(sync="file", file=Path({str(flag)!r})))
        watch.check()
        out = {{"before": watch.stamp(time.time()) is None}}
        Path({str(spec)!r}).write_text("-3600\\n")
        stamp = watch.stamp(time.time())
        out |= {{"flagged": stamp is not None, "wanted": watch.check_wanted.is_set(), "state": watch.describe()}}
        watch.check()
        out["still_flagged"] = watch.stamp(time.time()) is not None
        Path({str(flag)!r}).unlink()
        Path({str(flag)!r}).touch()
        watch.check()
        out |= {{"after": watch.stamp(time.time()) is None, "corrections": watch.corrections}}
        print(json.dumps(out))
    """)
    done = subprocess.run([sys.executable, "-c", script], env=_faked(spec), capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["before"]
    assert out["flagged"]
    assert out["wanted"]
    assert out["state"]["steps"] == 1
    assert -3610 < out["state"]["last_step"]["by_s"] < -3590
    assert out["still_flagged"]  # the file from before the step vouches for nothing after it
    assert out["after"]
    (correction,) = out["corrections"]
    assert correction["offset"] < time.time() - boottime() - 3590  # the stepped clock's offset


# -- the daemon, booted at 1970, stepped to now and back, with edged ingest -------------------------------------


@pytest.fixture
def persistent_broker(own_broker: Broker) -> Broker:
    own_broker.persistent = True  # the ingest's session (and what it missed) survives the broker's restart
    own_broker.start()
    return own_broker


def _db_rows(url: str, device: str) -> list[tuple[int, float, float | None, str | None]]:
    db = open_database(url)
    try:
        conn: Any = db.conn  # type: ignore[attr-defined]
        sql = "SELECT seq, ts, ts_original, clock FROM results WHERE device = ? AND pipeline = 'cam0' ORDER BY seq"
        return [(int(s), float(t), o, c) for s, t, o, c in conn.execute(sql, (device,))]
    finally:
        db.close()


def test_a_device_booted_at_1970_delivers_corrected_times_through_a_step_to_now_and_one_back(
    tmp_path: Path, persistent_broker: Broker, tiny_model: Path, start_daemon: StartDaemon
) -> None:
    broker = persistent_broker
    spec, flag = tmp_path / "faketime", tmp_path / "synchronized"
    spec.write_text("@1970-01-02 00:00:00\n", encoding="utf-8")  # a Pi without a real-time clock, no network
    video = make_video(tmp_path / "v.mp4", 40)
    cfg = base_config(tmp_path, tiny_model, str(video), broker=broker, fps=10, loop=True, stop_at_end=False)
    cfg["clock"] = {"sync": "file", "file": str(flag), "check_s": 0.5}
    cfg["mqtt"]["stats_interval_s"] = 0
    device = cfg["device_id"]
    url = str(tmp_path / "results.db")
    opts = IngestOptions(host=broker.host, port=broker.port, client_id=f"ingest-{device}", group="", replay_topic="")
    ingest = Ingest(opts, open_database(url))
    ingest.start()
    real_start = time.time()
    daemon = start_daemon(write_config(tmp_path / "edged.yaml", cfg), env=_faked(spec))
    try:
        # 1. booted at 1970: every result says the clock is not trusted, and carries its correction stamp
        wait_for(lambda: len(_db_rows(url, device)) >= 5, 60, "results stamped at 1970 in the database")
        assert all(ts < 200_000 and clock == "unsynced" for _, ts, _, clock in _db_rows(url, device))
        wait_for(lambda: _clock_state(daemon, "unsynchronized"), 30, "status to say the clock is not trusted")

        # 2. the broker goes away: results wait in the spool, flagged
        broker.stop()
        wait_for(lambda: ((daemon.status() or {}).get("spool") or {}).get("depth", 0) >= 5, 30, "a spooled backlog")

        # 3. the time service steps the clock to now and vouches for it
        spec.write_text("+0\n", encoding="utf-8")
        flag.touch()
        synced = wait_for(lambda: _clock_state(daemon, "synchronized"), 30, "the daemon to trust its clock")
        assert synced["steps"] >= 1
        synced_at = time.time()
        broker.start()  # 4. back: the spool drains corrected, the clock message corrects what went before
        wait_for(lambda: _all_corrected(url, device, synced_at), 60, "every flagged row corrected")

        stepped = _step_back_and_forth(daemon, spec, flag, url, device)
    finally:
        code, err = daemon.stop()
        ingest.stop()
        ingest.db.close()
    assert code == 0, err[-3000:]

    rows = _db_rows(url, device)
    seqs = [seq for seq, *_ in rows]
    assert seqs == list(range(1, len(seqs) + 1))  # every seq once, none lost through the steps and the outage
    flagged = [r for r in rows if r[3] is not None]
    assert len(flagged) >= 8
    assert all(clock == "corrected" for *_, clock in flagged)
    assert any(orig is not None and orig < 200_000 for _, _, orig, _ in flagged)  # stamped at 1970
    assert any(orig is not None and orig > REAL_NOW for seq, _, orig, _ in flagged if seq > stepped)  # an hour back
    times = [ts for _, ts, _, _ in rows]
    assert all(real_start - 5 < ts < time.time() + 5 for ts in times)  # every row in the test's real time
    assert all(b > a - 0.5 for a, b in itertools.pairwise(times))  # and in capture order
    steps = _steps(err)
    assert steps >= 3, err[-3000:]  # to now, an hour back, to now again: each seen and logged


def _step_back_and_forth(daemon: Any, spec: Path, flag: Path, url: str, device: str) -> int:
    """A step back by an hour, which the kernel takes as "no longer synchronized" (so the flag goes), then the
    service synchronizes again: the results of that hour back take the second correction. The last seq
    before the step back."""
    spec.write_text("-3600\n", encoding="utf-8")
    flag.unlink()
    wait_for(lambda: _clock_state(daemon, "unsynchronized"), 30, "the daemon to distrust its clock again")
    stepped = len(_db_rows(url, device))
    wait_for(lambda: _unsynced(url, device) >= 3, 30, "results stamped an hour back")
    spec.write_text("+0\n", encoding="utf-8")
    flag.touch()
    wait_for(lambda: _clock_state(daemon, "synchronized"), 30, "the daemon to trust its clock again")
    again_at = time.time()
    wait_for(lambda: _all_corrected(url, device, again_at), 60, "the rows stamped an hour back corrected")
    return stepped


def _clock_state(daemon: Any, state: str) -> dict[str, Any] | None:
    clock = ((daemon.status() or {}).get("clock")) or {}
    return clock if clock.get("state") == state else None


def _unsynced(url: str, device: str) -> int:
    return sum(1 for *_, clock in _db_rows(url, device) if clock == "unsynced")


def _all_corrected(url: str, device: str, after: float) -> bool:
    """No row waits for a correction, and rows captured after `after` arrived."""
    rows = _db_rows(url, device)
    return not any(c == "unsynced" for *_, c in rows) and any(ts > after for _, ts, _, _ in rows)


def _steps(stderr: str) -> int:
    return stderr.count("clock: the wall clock stepped by")


def test_without_a_kernel_boot_id_the_stamps_name_the_process_and_the_ingest_still_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel without /proc/sys/kernel/random/boot_id (this machine has one: the path is pointed elsewhere)."""
    from edged.core import clock
    from edged.fleet.ingestparse import Identity, parse_results

    monkeypatch.setattr(clock, "BOOT_ID", tmp_path / "no-boot-id")
    watch = ClockWatch(ClockConfig(sync="file", file=tmp_path / "flag"), tmp_path)
    watch.check()
    body = json.loads(_result(time.time(), watch))
    assert body["clock"]["boot"].startswith("process-")
    (row,) = parse_results(json.dumps({**body, "device": "d", "pipeline": "p"}).encode(), Identity("d", "p"))
    assert row.clock == "unsynced"


def test_after_a_step_the_flag_file_vouches_again_only_once_the_time_service_writes_it_again(
    tmp_path: Path,
) -> None:
    """`clock.sync: file` used to trust the clock again at the next check after a step of -1 h or +1 day,
    because the flag file still existed: results stamped an hour early, unflagged, status `synchronized`. The
    file that vouched for the time before the step does not vouch for it after."""
    flag = tmp_path / "synchronized"
    flag.touch()
    watch = ClockWatch(ClockConfig(sync="file", file=flag), tmp_path)
    watch.check()
    assert watch.describe()["state"] == "synchronized"
    assert watch.stamp(time.time() - 3600.0, boottime()) is not None  # a frame sees the wall clock step back 1 h
    watch.check()
    assert watch.describe()["state"] == "unsynchronized"
    assert watch.describe()["detail"] == f"{flag} was not written again since the clock stepped"
    assert watch.stamp(time.time()) is not None  # still flagged
    flag.unlink()
    flag.touch()  # systemd-timesyncd writes it again once it has set the clock
    watch.check()
    assert watch.describe()["state"] == "synchronized"


def test_a_command_refused_stale_by_a_device_whose_clock_stepped_says_so() -> None:
    from edged.control.controller import stepped_note

    note = stepped_note({"by_s": -3600.0, "at": time.time() - 5}, max_age_s=300)
    assert "this device's clock stepped by -3600 s 5 s ago" in note
    assert stepped_note({"by_s": -3600.0, "at": time.time() - 3600}, max_age_s=300) == ""  # long ago: not why
    assert stepped_note(None, max_age_s=300) == ""
