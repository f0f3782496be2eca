"""The replay window and replay requests on a real daemon through Mosquitto (uplink/replay.py, store/window.py):
results the broker acknowledged are sent again on request, byte for byte on their own topic; what the window
does not hold is answered as gone; bad requests are refused and answered, and results keep flowing."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from brokers import OtherBroker
from conftest import (
    Broker,
    StartDaemon,
    Subscribe,
    base_config,
    free_port,
    make_tiny_model,
    make_video,
    wait_for,
    write_config,
)
from paho.mqtt.enums import CallbackAPIVersion

from edged.fleet.ingest import Ingest, IngestOptions
from edged.fleet.ingestdb import open_database
from edged.fleet.report import build_report
from edged.store.spool import Spool, SpoolConfig
from edged.uplink.hooks import Incoming
from edged.uplink.replay import ReplayRequests


def _ask(broker: Broker, topic: str, body: Any) -> None:
    client = paho.Client(CallbackAPIVersion.VERSION2)
    client.connect(broker.host, broker.port)
    client.loop_start()
    payload = body if isinstance(body, bytes) else json.dumps(body).encode()
    client.publish(topic, payload, qos=1).wait_for_publish(10)
    client.loop_stop()
    client.disconnect()


@pytest.mark.integration
def test_a_replay_request_sends_acknowledged_results_again_and_says_what_is_gone(
    tmp_path: Path, broker: Broker, subscribe: Subscribe, start_daemon: StartDaemon
) -> None:
    model, video = make_tiny_model(tmp_path / "tiny.onnx"), make_video(tmp_path / "v.mp4", 30)
    cfg: dict[str, Any] = base_config(tmp_path, model, str(video), broker=broker, fps=20, loop=True, stop_at_end=False)
    device = cfg["device_id"]
    sub = subscribe(broker, f"edged/{device}/#")
    daemon = start_daemon(write_config(tmp_path / "edged.yaml", cfg))
    wait_for(lambda: len(sub.results()) >= 30, 60, "30 results")
    first = {json.loads(p)["seq"]: p for t, p, _ in list(sub.messages) if t.endswith("/results")}
    request = f"edged/{device}/replay/request"
    _ask(broker, request, {"v": 1, "id": "r1", "pipeline": "cam0", "ranges": [[2, 5], [10**9, 10**9]]})

    def answer(rid: str | None) -> dict[str, Any] | None:
        for body in (json.loads(p) for p, _ in sub.payloads(f"edged/{device}/replay/answer")):
            if body.get("id") == rid:
                return body  # type: ignore[no-any-return]
        return None

    got = wait_for(lambda: answer("r1"), 30, "the answer to r1")
    assert got["replayed"] == [[2, 5]]
    assert got["gone"] == [[10**9, 10**9]]
    assert got["window"][0] <= 2
    wait_for(lambda: sum(1 for m in sub.results() if m["seq"] in (2, 3, 4, 5)) >= 8, 30, "2..5 a second time")
    again = [p for t, p, _ in list(sub.messages) if t.endswith("/results") and json.loads(p)["seq"] in (2, 3, 4, 5)]
    assert sorted(again) == sorted([first[s] for s in (2, 3, 4, 5)] * 2)  # the same bytes, on the same topic
    # refused and answered: malformed, too many seqs; nothing sent again for them
    _ask(broker, request, b"\x00not json")
    _ask(broker, request, {"v": 1, "id": "big", "pipeline": "cam0", "ranges": [[1, 6000]]})
    big = wait_for(lambda: answer("big"), 30, "the answer to the large request")
    assert big["refused"] == "too_large"
    wait_for(lambda: answer(None), 30, "the answer to the malformed request")
    assert answer(None)["refused"] in ("not_utf8", "malformed", "not_json")  # type: ignore[index]
    snap = wait_for(lambda: (s := daemon.status()) and s["mqtt"]["replay"]["refused"] >= 2 and s, 30, "counted")
    assert snap["spool"]["replayed"] == 4
    assert snap["mqtt"]["replay"]["replayed"] == 4
    assert snap["spool"]["replay_window"]["rows"] > 0
    assert snap["state"] == "running", snap["reasons"]
    # aftermath: new results keep coming with new seqs
    top = max(m["seq"] for m in sub.results())
    wait_for(lambda: max(m["seq"] for m in sub.results()) >= top + 10, 30, "new results after the replays")
    code, err = daemon.stop(signal.SIGTERM)
    assert code == 0, err[-2000:]
    assert "no replay on this connection" not in err  # granted, then a clean stop: nothing was refused


def _window(tmp_path: Path, results: int, size: int = 100) -> Spool:
    """A spool whose `results` results of `size` bytes were all acknowledged straight from memory."""
    spool = Spool(tmp_path / "s.db", SpoolConfig(batch_ms=60_000))
    spool.start()
    for _ in range(results):
        seq = spool.next_seq("cam0")
        spool.append("cam0", seq, 1.0, "edged/dev/cam0/results", b"x" * size)
    spool.ack([r.id for r in spool.fetch(0, results)])
    return spool


def _request(rid: str, *ranges: list[int]) -> bytes:
    return json.dumps({"v": 1, "id": rid, "pipeline": "cam0", "ranges": list(ranges)}).encode()


def test_repeated_requests_never_push_other_results_out_of_the_window(tmp_path: Path) -> None:
    """The loss the issue measured: 30 requests for the same seqs used to make the window answer a later request
    for other seqs `gone`. Replayed results do not enter the window again, and 64 copies of one range in one
    request are sent once."""
    spool = _window(tmp_path, 200)
    hook = ReplayRequests(spool.replay, "dev", "edged/dev/replay", bytes_per_hour=0)
    for i in range(30):
        got = hook.answer(_request(f"r{i}", *([[1, 20]] * 64)))
        spool.ack([r.id for r in spool.fetch(0, 1000)])  # the broker takes what was sent again
        assert got["replayed"] == [[1, 20]]
    assert hook.snapshot()["replayed"] == 30 * 20  # 20 a request, not 64 x 20
    later = hook.answer(_request("later", [21, 200]))
    assert (later["replayed"], later["gone"]) == ([[21, 200]], [])
    assert spool.stats()["replay_window"]["rows"] == 200
    spool.close()


def test_the_hour_s_budget_bounds_what_a_requester_can_make_a_device_resend(tmp_path: Path) -> None:
    """An allowed requester asking again and again gets at most replay_max_bytes_per_hour: the rest is answered
    over_budget (and comes when asked again later), then refused `budget`; refusals are counted."""
    spool = _window(tmp_path, 100, size=100)
    hook = ReplayRequests(spool.replay, "dev", "edged/dev/replay", bytes_per_hour=5_000)
    first = hook.answer(_request("a", [1, 100]))
    assert first["replayed"] == [[1, 50]]
    assert first["over_budget"] == [[51, 100]]
    second = hook.answer(_request("b", [51, 100]))
    assert second["refused"] == "budget"
    counts = hook.snapshot()
    assert (counts["replayed"], counts["replayed_bytes"], counts["refused"]) == (50, 5_000, 1)
    spool.close()


@pytest.fixture(params=["mosquitto", "amqtt", "aedes", "ejabberd"])
def crashing(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Broker | OtherBroker]:
    """A broker of each implementation, started (not persistent: each as its defaults have it)."""
    kind = str(request.param)
    broker: Broker | OtherBroker
    broker = Broker("127.0.0.1", free_port(), tmp_path) if kind == "mosquitto" else OtherBroker(kind, tmp_path / kind)
    broker.start()
    yield broker
    broker.stop()


def _crash_and_restart(broker: Broker | OtherBroker) -> None:
    """kill -9: what it acknowledged and queued is gone; then the same broker again on the same port."""
    if isinstance(broker, OtherBroker):
        broker.kill()
    else:
        assert broker.proc is not None
        broker.proc.kill()
        broker.proc.wait()
        broker.proc = None
    broker.start()


@pytest.mark.integration
@pytest.mark.timeout(360)  # its own waits add up past the suite's 120 s: a slow broker restarts, a replay retries
def test_a_broker_crash_loses_nothing_through_edged_ingest(
    tmp_path: Path, crashing: Broker | OtherBroker, start_daemon: StartDaemon
) -> None:
    """The loss the issue measured, made certain, on every broker implementation: the broker queues for the
    ingest's persistent session while the ingest is away, acknowledging every result to the device, and is killed
    with -9: the queue is gone. The ingest back on the restarted broker sees the seqs jump, asks the device, and
    the device sends them again from its window: every seq lands, the report counts them recovered, none lost."""
    url = str(tmp_path / "r.db")
    username = getattr(crashing, "username", None)
    secret = crashing.password_file() if isinstance(crashing, OtherBroker) and username else None
    mqtt5 = not isinstance(crashing, OtherBroker) or crashing.kind == "ejabberd"
    opts = IngestOptions(host=crashing.host, port=crashing.port, client_id="ingest-crash", replay_after_s=1.0,
                         protocol="5" if mqtt5 else "3.1.1", group="" if isinstance(crashing, OtherBroker) else "g",
                         username=username, password_file=secret)  # fmt: skip
    ingests = [Ingest(opts, open_database(url))]
    try:
        got = _crash_through_ingest(tmp_path, crashing, start_daemon, ingests, url)
    finally:  # a failure must not leave the ingest's threads to the next tests
        for ingest in ingests:
            ingest.stop()
            ingest.db.close()
    entry = _report(url, got.pop("device"))
    assert entry["unexplained"] == 0
    assert entry["gone"] == 0
    assert entry["pipelines"][0]["first_seq"] == 1
    assert got["requests"] >= 1  # this ingest asked (its own count of what then came: the report's is the record)
    assert got["recovered"] >= 1


def _report(url: str, device: str) -> dict[str, Any]:
    db = open_database(url)
    try:
        return next(d for d in build_report(db)["devices"] if d["device"] == device)
    finally:
        db.close()


def _crash_through_ingest(
    tmp_path: Path, crashing: Broker | OtherBroker, start_daemon: StartDaemon, ingests: list[Ingest], url: str
) -> dict[str, Any]:
    """Results through the ingest, the ingest away, the broker killed with what it queued, the ingest back:
    the ingest's replay counts, and the device's id."""
    ingest = ingests[0]
    opts = ingest.opts
    ingest.start()
    model, video = make_tiny_model(tmp_path / "tiny.onnx"), make_video(tmp_path / "v.mp4", 30)
    cfg: dict[str, Any] = base_config(tmp_path, model, str(video), fps=30, loop=True, stop_at_end=False)
    cfg["mqtt"] |= {"enabled": True, "port": crashing.port}
    if opts.username:
        cfg["mqtt"] |= {"username": opts.username, "password_file": str(opts.password_file)}
    device = cfg["device_id"]
    daemon = start_daemon(write_config(tmp_path / "edged.yaml", cfg))
    wait_for(lambda: ingest.snapshot()["inserted"] >= 20, 90, "20 rows through the ingest")
    ingest.stop()  # away: the broker queues for its session
    published = daemon.status()["mqtt"]["published"]  # type: ignore[index]
    wait_for(lambda: daemon.status()["mqtt"]["published"] >= published + 100, 60, "100 more acknowledged")  # type: ignore[index]
    _crash_and_restart(crashing)
    ingest = Ingest(opts, open_database(url))
    ingests.append(ingest)
    ingest.start(timeout=60)

    def recovered() -> bool:
        entry = _report(url, device)
        return bool(entry["missing"] == 0 and entry["recovered"] >= 100)

    wait_for(recovered, 180, "every seq, recovered by replay")
    # the ingest's own count follows its database write (the report above is the record): wait for it too
    got: dict[str, Any] = wait_for(lambda: (g := ingest.snapshot()["replay"])["recovered"] >= 1 and g, 30,
                                   "the ingest's own count of what came back")  # fmt: skip
    daemon.stop(signal.SIGTERM)
    return got | {"device": device}


class _Answers:
    """Stands in for the connection's session: what the hook publishes (no broker needed to count answers)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    def publish(self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False) -> bool:
        self.sent.append((topic, payload))
        return True


def test_a_flood_of_bad_requests_gets_one_answer_a_second_and_is_counted(tmp_path: Path) -> None:
    """Refusals used to be answered one by one: a flood of junk made the device publish as much. Now one answer
    a second, the rest counted; a good request after the flood is answered."""
    spool = _window(tmp_path, 10)
    hook = ReplayRequests(spool.replay, "dev", "edged/dev/replay", bytes_per_hour=0)
    session = _Answers()
    for _ in range(25):  # the queue holds 32: all of them reach the hook's turn
        hook.message(Incoming("edged/dev/replay/request", b"junk"))
    hook.turn(session)  # type: ignore[arg-type]
    assert len(session.sent) == 1
    counts = hook.snapshot()
    assert (counts["refused"], counts["unanswered"]) == (25, 24)
    hook.message(Incoming("edged/dev/replay/request", _request("good", [1, 5])))
    hook.turn(session)  # type: ignore[arg-type]
    assert json.loads(session.sent[-1][1])["replayed"] == [[1, 5]]
    spool.close()
