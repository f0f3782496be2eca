"""The result path: spooled rows out to the broker, acknowledgements and refusals back to the spool.

One `ResultPump` lives as long as the publisher; each connection begins it again (`begin`: everything not yet
acknowledged goes again, from the oldest, under that connection's limits). All of it runs on the `edged-mqtt`
thread, except `window.acked` and `window.dropped`, which paho's callbacks call to record what happened.

- Out: the oldest unacknowledged rows, batched (`mqtt.batch` per message, same topic), each message sized to
  the broker's Maximum Packet Size (a batch is split until it fits; one result that can never fit is a dead
  letter at once), at most the in-flight window unacknowledged (the smaller of `mqtt.max_inflight` and the
  broker's Receive Maximum), at most `mqtt.max_rate` messages a second.
- On the way, a result stamped while the wall clock was not trusted gets its true time once it is
  (`correct`, core/clock.py): the spool keeps the row as it was written.
- Back: acknowledged rows leave the spool; a refused one is counted, and after `dead_letter_after` refusals
  set aside; refused rows are sent again after a backoff.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import paho.mqtt.client as paho

from edged.core.backoff import Backoff
from edged.store.outlet import Outlet
from edged.store.spooldb import Row
from edged.uplink.brokerlimits import BrokerLimits, publish_size
from edged.uplink.inflight import InFlight, Message
from edged.uplink.mqttclient import ExpiryProperties, TokenBucket
from edged.uplink.mqttstats import MqttStats
from edged.uplink.settings import MqttConfig

log = logging.getLogger(__name__)

# results handed to paho at a time (all still in the spool until acknowledged): with the default window of
# 32, paho holds 16 windows' worth queued, so its network thread keeps the broker busy on its own; draining a
# backlog with 128 at a time ran at 0.6x a bare paho loop, with 512 at 0.85x (benchmarks/store_forward.py)
HANDOFF_RESULTS = 512

Correct = Callable[[bytes], bytes]


class ResultPump:
    """Spool → broker → spool, for one connection after another (see the module docstring)."""

    def __init__(
        self, cfg: MqttConfig, spool: Outlet, stats: MqttStats, wake: Callable[[], None], correct: Correct | None = None
    ) -> None:
        self.cfg = cfg
        self._correct = correct  # a payload on its way out, its time corrected (core/clock.py); None: as stored
        self.spool = spool
        self.stats = stats
        self._wake = wake
        self.window = InFlight(cfg.protocol, cfg.max_inflight)
        self.limits = BrokerLimits()
        self.inflight = cfg.max_inflight  # this connection's window: the broker's Receive Maximum when smaller
        self._props = ExpiryProperties(cfg)
        self._rate = TokenBucket(cfg.max_rate)
        self._refused_backoff = Backoff(cfg.reconnect_min_s, cfg.reconnect_max_s)
        self._cursor = 0
        self._seen_changes = -1
        self._retry_at: float | None = None  # refused rows are sent again from then on

    def speak(self, cfg: MqttConfig) -> None:
        """The MQTT version changed (a fallback to 3.1.1, or back): properties and reason codes follow it."""
        self._props = ExpiryProperties(cfg)
        self.window.protocol = cfg.protocol

    def begin(self, limits: BrokerLimits, protocol: str) -> None:
        """A new connection: everything unacknowledged goes again from the oldest, within what its CONNACK said
        (brokerlimits.py): the in-flight window, the largest packet, and what the broker cannot do (status
        reasons)."""
        self.window.reset()
        self.limits = limits
        self.inflight = limits.inflight(self.cfg.max_inflight)  # paho's window was set on the CONNACK
        self.window.wake_below = self.inflight
        self._cursor = 0
        self._seen_changes = -1
        if self.inflight < self.cfg.max_inflight:
            log.info("mqtt: the broker's Receive Maximum is %d: at most %d results in flight", limits.receive_max,
                     self.inflight)  # fmt: skip
        if limits.max_packet is not None:
            log.info("mqtt: the broker accepts packets of at most %d bytes", limits.max_packet)
        if limits.assigned_id:
            log.info("mqtt: the broker assigned the client id %r", limits.assigned_id)
        problems = limits.problems(self.cfg.qos)
        for problem in problems:
            log.error("mqtt: %s", problem)
        with self.stats.lock:
            self.stats.broker_limits = limits.describe() if protocol == "5" else {}
            self.stats.protocol = protocol
            self.stats.broker_problems = problems

    def end(self) -> None:
        """The connection closed: acks that came in before still count."""
        self.flush_acks()
        self.window.reset_keep_carried()

    def timer_s(self) -> float | None:
        """Seconds until this pump wants to run again by itself (a refused row's retry, the rate limit)."""
        timers = []
        if self._retry_at is not None:
            timers.append(self._retry_at - time.monotonic())
        if self._rate.rate:
            timers.append(self._rate.wait_s() or 1.0 / self._rate.rate)
        return min(timers) if timers else None

    def drained(self, deadline: float) -> bool:
        """Done before a stop: nothing in flight and nothing left in the spool (acks collected first), or the
        grace period (until `deadline`) is over and what is left waits in the spool for next time."""
        if time.monotonic() >= deadline:
            left = self.spool.depth
            if left:
                log.warning("mqtt: stop grace period over; %d results stay in the spool for next time", left)
            return True
        self.flush_acks()
        return not len(self.window) and self.spool.depth == 0

    # -- out -------------------------------------------------------------------------------------------

    def pump(self, client: paho.Client) -> None:
        """Hand paho the next rows the window, the rate and the broker's limits allow."""
        window = self.window
        # paho sends at most max_inflight unacknowledged; the rest of a burst waits in its queue, and its
        # network thread sends the next one on each PUBACK without waiting for this thread (whose turns
        # at the GIL would slow it down: few, large bursts are cheaper than many small ones). With
        # batching the bound counts results: big messages need no long queue, and each one costs memory.
        careful = window.careful
        size = window.careful_window if careful else max(self.inflight + 1, HANDOFF_RESULTS // self.cfg.batch)
        room = min(size - len(window), self._rate.allow())
        if room <= 0:
            return
        if self._retry_at is not None and not len(window) and time.monotonic() >= self._retry_at:
            self._retry_at = None  # rows the broker refused: send them again from the oldest
            self._cursor = 0
            self._seen_changes = -1
        changes = self.spool.changes()
        if changes == self._seen_changes:
            return  # nothing new since the last empty fetch
        rows = self.spool.fetch(self._cursor, room if careful else room * self.cfg.batch)
        if not rows:
            self._seen_changes = changes
            return
        sent: list[tuple[int, Message]] = []
        try:
            self._publish_rows(client, self._groups(rows, careful), sent)
        finally:
            if sent:
                self._rate.take(len(sent))
                if window.register(sent):
                    self._wake()  # acknowledged already: collect them on the next turn, at once

    def _publish_rows(self, client: paho.Client, groups: list[list[Row]], sent: list[tuple[int, Message]]) -> None:
        """Hand the groups to paho, one message each, recording (mid, message) in `sent`."""
        qos, ttl_offset, publish = self.cfg.qos, self.spool.ttl_offset(), client.publish
        for group in self._fitting(groups, ttl_offset):
            first = group[0]
            props = self._props(first.clock + ttl_offset)  # the oldest row of a group expires first
            payload = self._payload(group)
            size = publish_size(first.topic, payload, qos, props)
            if not self.limits.fits(size):  # one result alone that the broker said it would refuse
                self._cursor = group[-1].id
                why = (
                    f"a result of {size} bytes (as an MQTT packet) is larger than the broker's Maximum Packet Size "
                    f"of {self.limits.max_packet} bytes (CONNACK); it can never be sent"
                )
                self.refuse([first.id], why, final=True)
                continue
            try:
                info = publish(first.topic, payload, qos=qos, properties=props)
            except ValueError as exc:  # a topic paho will not send (wildcards, too long): never sendable
                self._cursor = group[-1].id
                self.refuse([r.id for r in group], f"cannot publish to {first.topic!r}: {exc}", final=True)
                continue
            if info.rc != paho.MQTT_ERR_SUCCESS:
                log.debug("mqtt: publish returned %s; will resend after reconnect", info.rc)
                return
            self._cursor = group[-1].id
            sent.append((info.mid, Message([r.id for r in group], [(r.stream, r.ts) for r in group])))

    def _fitting(self, groups: list[list[Row]], ttl_offset: float) -> list[list[Row]]:
        """The groups, those of several results split in halves until each fits the broker's Maximum Packet
        Size (a result too big alone is left for `_publish_rows` to refuse)."""
        if self.limits.max_packet is None:
            return groups
        out: list[list[Row]] = []
        todo = list(reversed(groups))
        while todo:
            group = todo.pop()
            props = self._props(group[0].clock + ttl_offset)
            if len(group) > 1 and not self.limits.fits(
                publish_size(group[0].topic, self._payload(group), self.cfg.qos, props)
            ):
                half = len(group) // 2
                todo += [group[half:], group[:half]]
                continue
            out.append(group)
        return out

    def _groups(self, rows: list[Row], careful: bool) -> list[list[Row]]:
        """Consecutive rows with the same topic, up to `batch` per message."""
        if careful or self.cfg.batch == 1:
            return [[row] for row in rows]  # careful: one result per message, so a culprit is found alone
        groups: list[list[Row]] = []
        for row in rows:
            if groups and groups[-1][0].topic == row.topic and len(groups[-1]) < self.cfg.batch:
                groups[-1].append(row)
            else:
                groups.append([row])
        return groups

    def _payload(self, group: list[Row]) -> bytes:
        fix = self._correct
        if self.cfg.batch == 1:
            return group[0].payload if fix is None else fix(group[0].payload)
        return b"[" + b",".join(r.payload if fix is None else fix(r.payload) for r in group) + b"]"

    # -- back ------------------------------------------------------------------------------------------

    def flush_acks(self) -> None:
        """Hand what the broker acknowledged to the spool, count it; apply refusals at once."""
        acked = self.window.collect()
        if acked.ids:
            self.spool.ack(acked.ids)
            self.stats.count_published(len(acked.ids), acked.e2e)
            self._refused_backoff.reset()
        for ids, why in acked.refused:
            self.refuse(ids, why)
            if self._retry_at is None:
                self._retry_at = time.monotonic() + self._refused_backoff.next_delay()

    def refuse(self, row_ids: list[int], why: str, *, final: bool = False) -> None:
        """Count a refusal of these rows now (`final`: they can never be sent: dead letters at once)."""
        dead = sum(self.spool.refuse(row_id, why, final=final) for row_id in row_ids)
        with self.stats.lock:
            self.stats.failed += len(row_ids)
            self.stats.last_error = why
        log.warning(
            "mqtt: %s (%d result(s); %d set aside as dead letters; the rest stay in the spool)",
            why, len(row_ids), dead,
        )  # fmt: skip
