"""Every line `edged status` can give as a reason for `degraded`: how it is made, its shape, what it means, what
to do. The builders below make the lines from what the parts report (each a pure read); the daemon joins them.

docs/status.md's troubleshooting table is generated from this list (scripts/reasons_table.py), and the test
suite holds it to the code: every reasons line any test sees must match one entry (tests/reasons_seen.py).
A new reason line in the code without an entry here fails the suite, so the page cannot fall behind.

`pattern` is a regular expression over the whole line; `example` is a real line of that shape and must match
it. Free text from elsewhere (an OpenCV or SQLite error, a broker's reason string) is matched as `.+`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from edged.core.stats import REFUSED_WINDOW_S
from edged.core.threads import Supervised
from edged.pipeline.runner import PipelineRunner
from edged.store.capacity import describe
from edged.store.writer import RECENT_S
from edged.uplink.inbound import FLOOD_WINDOW_S, PER_TOPIC_PER_S
from edged.uplink.mqttstats import MqttStats

ACK_STALL_S = 30.0  # connected, results waiting, and no PUBACK for this long: the broker is stuck

_P = r"pipeline \S+ "  # every pipeline reason starts with its name
_SRC = _P + r"reconnecting: .+?: "  # then the source (a stream's address without its password)


@dataclass(frozen=True)
class Reason:
    """One shape of reasons line."""

    topic: str  # the group in the table: source, model, thread, broker, spool
    pattern: str
    example: str
    means: str
    action: str

    def matches(self, line: str) -> bool:
        """Whether `line` has this shape."""
        return re.fullmatch(self.pattern, line) is not None


CATALOG: tuple[Reason, ...] = (
    Reason(
        "source",
        _SRC + r"stalled: no frame for [\d.]+ s after \d+ frames",
        "pipeline cam0 reconnecting: rtsp://cam.local/stream: stalled: no frame for 5.0 s after 1234 frames",
        "A stream stopped sending frames with its connection open (the camera hangs, a switch drops packets); "
        "edged reopens it.",
        "Check the camera and the network between; `source.stall_s` sets how long a silence is a stall.",
    ),
    Reason(
        "source",
        _SRC + r"cannot open: the camera at \S+ has no stream at \S* \(404 Not Found\): check the path",
        "pipeline cam0 reconnecting: rtsp://cam.local/stream2: cannot open: the camera at cam.local:554 has no "
        "stream at /stream2 (404 Not Found): check the path",
        "The camera answers but has no stream at that path.",
        "Fix the path in `source.uri` (the camera's manual or its web page names it); `edged check-config`.",
    ),
    Reason(
        "source",
        _SRC + r"cannot open: the camera at \S+ refused (the user name or password in the URL|no user name and "
        r"password) \(401 Unauthorized\)",
        "pipeline cam0 reconnecting: rtsp://admin:***@cam.local/stream: cannot open: the camera at cam.local:554 "
        "refused the user name or password in the URL (401 Unauthorized)",
        "The camera wants a user name and password, or refused the ones in the URL.",
        "Put `user:password@` in `source.uri` (URL-encode special characters); the password is shown as `***`.",
    ),
    Reason(
        "source",
        _SRC + r"cannot open: (nothing listens on \S+ \(connection refused\)|no RTSP answer from \S+ within [\d.]+ s|"
        r"cannot reach \S+: .+|\S+ did not answer RTSP|the camera at \S+ answered \d+ to a DESCRIBE of \S*)",
        "pipeline cam0 reconnecting: rtsp://cam.local/stream: cannot open: nothing listens on cam.local:554 "
        "(connection refused)",
        "The camera is off, unreachable, or not an RTSP server at that port; edged keeps trying "
        "(at most `source.reconnect_max_s` apart).",
        "Check the camera's power, address and port (`ping`, the camera's web page); nothing to do if it is "
        "merely rebooting.",
    ),
    Reason(
        "source",
        _SRC + r"cannot open: the stream did not open",
        "pipeline cam0 reconnecting: rtsp://cam.local/stream: cannot open: the stream did not open",
        "The camera accepted the request but OpenCV could not read the stream (codec or transport).",
        "Try the URL with `ffplay`; choose an H.264 or MJPEG stream on the camera.",
    ),
    Reason(
        "source",
        _SRC + r"cannot open \(device busy or gone, or unsupported format\)",
        "pipeline cam0 reconnecting: /dev/video0: cannot open (device busy or gone, or unsupported format)",
        "A camera device is missing, in use by another program, or cannot give the format asked.",
        "`ls /dev/video*`; stop whatever else uses it (`fuser /dev/video0`); the user `edged` must be in group "
        "`video`.",
    ),
    Reason(
        "source",
        _P + r"reconnecting: \S+: no such device \S+ \(video devices here: [^)]*\); the pipeline waits for it "
        r"to appear",
        "pipeline cam0 reconnecting: /dev/vidoe0: no such device /dev/vidoe0 (video devices here: /dev/video0); "
        "the pipeline waits for it to appear",
        "The device path names nothing: a camera not plugged in yet, or a typo in source.uri (check-config says "
        "so too, as a note).",
        "Compare source.uri with the video devices listed; plug the camera in, or fix the path and reload.",
    ),
    Reason(
        "source",
        _SRC + r"file not found",
        "pipeline cam0 reconnecting: /data/clip.mp4: file not found",
        "A video file that was there at start is gone.",
        "Put the file back or fix `source.uri`.",
    ),
    Reason(
        "source",
        _SRC + r"this OpenCV build has no GStreamer support: .+",
        "pipeline cam0 reconnecting: libcamerasrc ! ... ! appsink: this OpenCV build has no GStreamer support: "
        "install the distribution's python3-opencv ...",
        "A GStreamer pipeline as the source needs an OpenCV built with GStreamer; PyPI's is not.",
        "Do what the line says (JetPack's or Pi OS's python3-opencv, a venv with --system-site-packages), or "
        "use `/dev/videoN`.",
    ),
    Reason(
        "source",
        _SRC + r"(end of file|read failed|input ended|read failed: .+|command exited with status -?\d+)"
        r"( after \d+ frames)?",
        "pipeline cam0 reconnecting: /dev/video0: read failed after 5120 frames",
        "The source ended or a read failed (a camera unplugged, a sensor command that exited); edged reopens it.",
        "Look at the device or the command (`journalctl -u edged` has the first failures); a video file that "
        "should repeat wants `source.loop: true`.",
    ),
    Reason(
        "source",
        _SRC + r"cannot open: .+",
        "pipeline vib reconnecting: /run/vib.fifo: cannot open: [Errno 2] No such file or directory: '/run/vib.fifo'",
        "The source could not be opened; the detail is the system's or OpenCV's own words.",
        "Act on the detail: a path that does not exist, a permission, a device in use.",
    ),
    Reason(
        "source",
        _P + r"waiting: waiting for data(: no samples for [\d.]+ s)?",
        "pipeline vib waiting: waiting for data: no samples for 10 s",
        "A sensor source is open but sends nothing (the feed stopped or has not started).",
        "Start the feed or check the program that writes it; `source.stall_s` sets how long a silence is allowed.",
    ),
    Reason(
        "model",
        _P + r"failed: (inference failed|storing the result failed): .+",
        "pipeline cam0 failed: inference failed: [ONNXRuntimeError] : 2 : INVALID_ARGUMENT : ...",
        "The model run (or storing its result) raised; this pipeline stopped, the others go on.",
        "Check the model against the config with `edged check-config`; fix and `systemctl reload edged` (or restart).",
    ),
    Reason(
        "model",
        _P + r"failed: set aside: its model .+",
        "pipeline cam0 failed: set aside: its model cannot be loaded: cannot load model "
        "/var/lib/edged/models/yard.onnx: ...; no earlier model ran cleanly here",
        "At start this pipeline's model could not be loaded, or it had died with the daemon twice before it ran "
        "cleanly (a native crash in ONNX Runtime), and no earlier model of this pipeline ever ran cleanly here. The "
        "pipeline does not run; the other pipelines, the spool, the uplink and remote control do.",
        "Fix or replace the model (`edged check-config`, `edged inspect MODEL`), then restart edged; remote control "
        "still works (`edged fleet send config`, a rollout).",
    ),
    Reason(
        "model",
        _P + r"runs its last good model \([0-9a-f]{12}\): .+",
        "pipeline cam0 runs its last good model (3f2a9c0d11e4): its model cannot be loaded: cannot load model "
        "/var/lib/edged/models/yard-v8.onnx: ...",
        "The configured model could not run at start (it does not load, or it died with the daemon before it ran "
        "cleanly); the pipeline runs the last model that ran cleanly here (kept under `<state_dir>/models/`).",
        "Fix or replace the configured model and restart (or reload); until then results come from the older "
        "model, and say so (`model.sha256` in each result).",
    ),
    Reason(
        "model",
        _P + r"refused \d+ result\(s\) in the last \d+ s, not published: .+",
        "pipeline cam0 refused 12 result(s) in the last 60 s, not published: detect: the model gave classes [2] "
        "beyond its 2 labels (person, car)",
        "The model's outputs on these frames do not fit what the decoder reads (an output's shape changed, a class "
        "beyond the labels, boxes that are not boxes): those results were dropped, the pipeline goes on.",
        "Check the pairing with `edged check-config` and `edged inspect MODEL`; fix `postprocess` (labels, format, "
        "outputs) or the model, then reload.",
    ),
    Reason(
        "thread",
        _P + r"failed: (source thread|inference worker) died: .+",
        "pipeline cam0 failed: source thread died: ValueError: ...",
        "A thread of the pipeline ended on an error edged did not expect: a bug.",
        "Restart edged (`systemctl restart edged`); please report it with the log (`journalctl -u edged`).",
    ),
    Reason(
        "thread",
        r"thread \S+ died(: .+)?",
        "thread edged-mqtt died: RuntimeError: ...",
        "One of the daemon's threads ended; what it did (publishing, status, reload, control) has stopped.",
        "Restart edged; please report it with the log.",
    ),
    Reason(
        "thread",
        r"thread \S+ restart(ing|ed) after: .+",
        "thread edged-control restarted after: RecursionError: maximum recursion depth exceeded",
        "A thread that heals (remote control, reload, status, metrics) ended on an error edged did not expect and "
        "was started again; the line stays for a minute of clean running.",
        "Nothing to do if it clears; if it comes back, please report it with the log (`journalctl -u edged`).",
    ),
    Reason(
        "thread",
        r"thread \S+ in a crash loop: \d+ deaths in \d+ min; last: .+",
        "thread edged-control in a crash loop: 3 deaths in 5 min; last: RuntimeError: ...",
        "A thread keeps ending on the same error; it is tried again less and less often (at most once a minute).",
        "Read the log for the error; restart edged after fixing its cause, and please report it.",
    ),
    Reason(
        "broker",
        r"broker not connected",
        "broker not connected",
        "edged has not reached the broker yet; results wait in the spool.",
        "Wait a few seconds after a start; if it stays, see the lines below for why.",
    ),
    Reason(
        "broker",
        r"broker not connected: cannot connect to \S+: .+",
        "broker not connected: cannot connect to broker.local:8883: [Errno 111] Connection refused",
        "The broker is not reachable (down, wrong host or port, a firewall, TLS mismatch); results wait in the "
        "spool and go out when it answers.",
        "Check `mqtt.host`, `mqtt.port` and `mqtt.tls` against the broker; `mosquitto_sub -h HOST -p PORT -t '#'` "
        "from the device.",
    ),
    Reason(
        "broker",
        r"broker not connected: broker \S+ refused the connection: .+",
        "broker not connected: broker broker.local:1883 refused the connection: the broker refused the user "
        "name or password (mqtt.username, mqtt.password_file): Bad user name or password (0x86)",
        "The broker answered and said no, with its reason code (bad credentials, not authorized, client id "
        "refused, an MQTT version it does not speak).",
        'Do what the line says: credentials, the broker\'s ACL, `mqtt.client_id`, or `mqtt.protocol: "3.1.1"`.',
    ),
    Reason(
        "broker",
        r"broker not connected: (broker \S+ closed the connection before its CONNACK|no CONNACK from \S+ within "
        r"[\d.]+ s to an MQTT (5|3\.1\.1) CONNECT( \(trying MQTT 3\.1\.1 now\))?)",
        "broker not connected: no CONNACK from broker.local:1883 within 10 s to an MQTT 3.1.1 CONNECT",
        "The connection opened but the broker did not accept it. Unanswered in MQTT 5, edged tries 3.1.1 at once "
        "(amqtt and other 3.1.1-only brokers never answer a version 5 CONNECT) and keeps the version that works; "
        "unanswered in 3.1.1 too: overloaded, not an MQTT broker, or TLS expected.",
        "Check the broker's log; TLS on the port wants `mqtt.tls`; a broker that speaks 3.1.1 only wants "
        '`mqtt.protocol: "3.1.1"` (saves the first attempt).',
    ),
    Reason(
        "broker",
        r"broker not connected: disconnected from \S+: .+",
        "broker not connected: disconnected from broker.local:1883: another client with client id 'pi-01' took "
        "the session (two devices with one device_id or mqtt.client_id?): Session taken over (0x8E)",
        "The broker closed the connection, with its reason (a takeover, a limit exceeded, the broker shutting "
        "down); edged reconnects.",
        "A takeover: give each device its own `device_id`. A limit: the line names it. Otherwise see the broker's log.",
    ),
    Reason(
        "broker",
        r"broker not connected: (the broker closed the connection over this message: .+|broker refused the "
        r"message: .+|cannot publish to .+|a result of \d+ bytes .+)",
        "broker not connected: the broker closed the connection over this message: Unspecified error",
        "The broker refused or dropped the connection over one result; after `mqtt.dead_letter_after` refusals "
        "it is set aside as a dead letter and the others go on.",
        "See the next lines and the broker's log (an ACL on the topic, a size limit).",
    ),
    Reason(
        "broker",
        r"the broker closed the connection \d+ times within \d+ s, each soon after accepting it: another client "
        r"with client id .+ may be taking the session .+",
        "the broker closed the connection 3 times within 60 s, each soon after accepting it: another client with "
        "client id 'pi-01' may be taking the session (two devices with one device_id?)",
        "A broker that does not give a reason (Mosquitto 2.0) keeps closing the connection at once: most likely "
        "two devices use one client id.",
        "Give each device its own `device_id` (or `mqtt.client_id`).",
    ),
    Reason(
        "broker",
        r"the broker grants QoS \d at most \(CONNACK Maximum QoS\): results need QoS \d acknowledgements, so they "
        r"stay in the spool",
        "the broker grants QoS 0 at most (CONNACK Maximum QoS): results need QoS 1 acknowledgements, so they stay "
        "in the spool",
        "The broker cannot acknowledge messages, so edged cannot know any result arrived: nothing is sent.",
        "Allow QoS 1 on the broker (`max_qos` in mosquitto.conf), or use another broker.",
    ),
    Reason(
        "broker",
        r"\d+ message\(s\) on \S+ dropped in the last \d+ s: a flood \(more than \d+ a second on one topic\)",
        "340000 message(s) on edged/pi-01/replay/request dropped in the last 60 s: a flood (more than 20 a second "
        "on one topic)",
        "A client of the broker sends this device far more messages on a topic it reads (replay requests, "
        "commands) than an ingest or an operator ever would. edged drops the excess before reading it; results, "
        "signed commands on other topics and the rest go on. Shown for a minute after the last dropped message.",
        "Find the client in the broker's log and stop it; let each client publish only where it must "
        "(docs/security.md, the ACLs to set).",
    ),
    Reason(
        "broker",
        r"the broker does not keep retained messages \(CONNACK Retain Available 0\): .+",
        "the broker does not keep retained messages (CONNACK Retain Available 0): the availability topic and "
        "Home Assistant discovery are sent without retain",
        "Results flow, but a subscriber that connects later does not see `online` or the discovery messages.",
        "Enable retained messages on the broker (`retain_available true`).",
    ),
    Reason(
        "spool",
        r"\d+ result\(s\) dropped in the last \d+ s \(see spool\.dropped_by_reason\)",
        "12 result(s) dropped in the last 60 s (see spool.dropped_by_reason)",
        "Results were lost on purpose: the spool was full (`full_evicted_oldest`, `full_rejected_newest`) or "
        "results outlived `spool.max_age` (`expired`).",
        "Bring the broker back, or give the spool more room (`spool.max_bytes`, `spool.max_age`); "
        "`edged status --json` has the counts by reason.",
    ),
    Reason(
        "spool",
        r"\d+ result\(s\) set aside as dead letters in the last \d+ s: .+",
        "1 result(s) set aside as dead letters in the last 60 s: a result of 612 bytes (as an MQTT packet) is "
        "larger than the broker's Maximum Packet Size of 300 bytes (CONNACK); it can never be sent",
        "The broker refused these results for good (too large, a topic it forbids); they stay in the spool's "
        "dead-letter table, the others flow.",
        "Fix what the line names (the broker's limit, its ACL, a smaller snapshot); the dead letters are in "
        "`spool.db`'s `dead_letters` table.",
    ),
    Reason(
        "spool",
        r"unclean stop: \d+ seq\(s\) uncertain \(.+; see spool\.seq_gaps\)",
        "unclean stop: 8 seq(s) uncertain (cam0 1040..1047; see spool.seq_gaps)",
        "edged did not stop cleanly (power cut, kill -9): each seq in the range was delivered before the stop, "
        "lost with it, or never used. Shown for a minute; the gap is also published on the `gaps` topic.",
        "Nothing, unless power cuts are frequent: then check the supply. See store-and-forward.md, *Durability*.",
    ),
    Reason(
        "spool",
        r"the spool holds only ~[\w ]+ of outage at the current rate \(spool\.min_capacity [\w ]+\): raise "
        r"spool\.max_bytes or free disk space",
        "the spool holds only ~12 min of outage at the current rate (spool.min_capacity 1 h 0 min): raise "
        "spool.max_bytes or free disk space",
        "At the rate results come now, the room the spool has (spool.max_bytes, lowered to what the disk holds) "
        "would fill within spool.min_capacity of a broker outage; results beyond it would be dropped "
        "(spool.on_full). Said while online, before the outage comes.",
        "Give the spool more room (spool.max_bytes, a larger disk, less else on it), send fewer results (the "
        "publish filter, a lower fps), or lower spool.min_capacity to what the site needs.",
    ),
    Reason(
        "spool",
        r"the broker acknowledged nothing for \d+ s with \d+ results waiting",
        "the broker acknowledged nothing for 45 s with 310 results waiting",
        "Connected, but no PUBACK comes back: the broker is overloaded or stuck.",
        "Check the broker (its log, its load); restarting it is safe, the results wait in the spool.",
    ),
    Reason(
        "spool",
        r"spool write failed: .+ \(disk full or read-only\?\); retrying, results are kept in memory",
        "spool write failed: database or disk is full (disk full or read-only?); retrying, results are kept in memory",
        "The spool cannot write: the disk is full or read-only. Results wait in memory and then frames are "
        "dropped (counted); all resumes when space returns.",
        "Free space on the state_dir's filesystem (`df -h /var/lib/edged`); check for a read-only remount (`dmesg`).",
    ),
    Reason(
        "spool",
        r"cannot persist the seq lease: .+",
        "cannot persist the seq lease: No space left on device",
        "edged cannot record which seqs it has handed out, so new results wait: a full or read-only disk.",
        "As for a spool write failure: free space, check the filesystem.",
    ),
    Reason(
        "spool",
        r"spool damaged \(.+\); restart edged to move it aside",
        "spool damaged (database disk image is malformed); restart edged to move it aside",
        "The spool's integrity check failed (a bad SD card, a filesystem that lied about fsync).",
        "Restart edged: the damaged file is kept beside a new one for inspection. Check the card (`dmesg`).",
    ),
)


def explain(line: str) -> Reason | None:
    """The catalog's entry for a reasons line (the first whose pattern matches), None if there is none."""
    return next((reason for reason in CATALOG if reason.matches(line)), None)


# -- the lines, from what the parts report -------------------------------------------------------------------


def pipeline_reasons(runners: Sequence[PipelineRunner]) -> list[str]:
    """A pipeline reconnecting, failed or waiting for data (and why), refusing its model's results lately; a thread
    of one that died."""
    out = [
        f"pipeline {runner.name} {runner.stats.state}" + (f": {runner.stats.error}" if runner.stats.error else "")
        for runner in runners
        if runner.stats.state in ("reconnecting", "failed", "waiting")  # waiting: a sensor sends no data
    ]
    out += [f"pipeline {runner.name} {runner.fallback}" for runner in runners if runner.fallback]
    for runner in runners:
        refused, why = runner.stats.refused_recently()
        if refused:
            window = f"{REFUSED_WINDOW_S:.0f}"
            out.append(
                f"pipeline {runner.name} refused {refused} result(s) in the last {window} s, not published: {why}"
            )
        out += runner.deaths()
    return out


def thread_reasons(threads: Iterable[Supervised | None]) -> list[str]:
    """The daemon's own threads live as long as it runs: one that ended died, with or without a cause; one that
    heals is named while it restarts and until it has run cleanly for a while (core/threads.py)."""
    return [why for t in threads if t is not None and (why := t.trouble()) is not None]


def broker_reasons(mqtt: MqttStats) -> list[str]:
    """Not connected (and why, in the broker's words), a suspected session takeover, and what the broker cannot
    do that edged needs."""
    with mqtt.lock:
        connected, last, problems = mqtt.connected, mqtt.last_error, list(mqtt.broker_problems)
        suspicion = mqtt.suspicion
    out = [] if connected else [f"broker not connected: {last}" if last else "broker not connected"]
    if suspicion is not None and time.monotonic() - suspicion[0] < RECENT_S:  # still going on, maybe
        out.append(suspicion[1])
    out += [f"{n} message(s) on {topic} dropped in the last {FLOOD_WINDOW_S:.0f} s: a flood (more than "
            f"{PER_TOPIC_PER_S:.0f} a second on one topic)" for topic, n in mqtt.inbound.floods()]  # fmt: skip
    return out + problems


def spool_reasons(spool: dict[str, Any], mqtt: MqttStats) -> list[str]:
    """The spool's error, results dropped or set aside as dead letters lately, an unclean stop's uncertain seqs,
    a broker that acknowledges nothing."""
    out = []
    if spool.get("error"):
        out.append(str(spool["error"]))
    recent = int(spool.get("dropped_recent", 0))
    if recent > 0:
        out.append(f"{recent} result(s) dropped in the last {RECENT_S:.0f} s (see spool.dropped_by_reason)")
    dead = int(spool.get("dead_letters_recent", 0))
    if dead > 0:  # refused by the broker for good: not delivered
        out.append(
            f"{dead} result(s) set aside as dead letters in the last {RECENT_S:.0f} s: "
            f"{mqtt.last_error or 'the broker refused them'}"
        )
    gaps = [g for g in spool.get("seq_gaps") or () if time.time() - float(g.get("ts", 0)) < RECENT_S]
    if gaps:  # not drops: each seq was sent before the stop, lost with it, or never used; nobody knows which
        where = ", ".join(f"{g['pipeline']} {g['first']}..{g['last']}" for g in gaps[:2])
        n = sum(int(g["last"]) - int(g["first"]) + 1 for g in gaps)
        out.append(f"unclean stop: {n} seq(s) uncertain ({where}; see spool.seq_gaps)")
    capacity, floor = spool.get("capacity_s"), spool.get("min_capacity_s")
    if isinstance(capacity, int | float) and isinstance(floor, int | float) and capacity < floor:
        out.append(
            f"the spool holds only ~{describe(capacity)} of outage at the current rate (spool.min_capacity "
            f"{describe(floor)}): raise spool.max_bytes or free disk space"
        )
    stalled = mqtt.ack_stalled_s()
    if stalled > ACK_STALL_S and int(spool.get("depth", 0)) > 0:
        out.append(f"the broker acknowledged nothing for {stalled:.0f} s with {spool['depth']} results waiting")
    return out
