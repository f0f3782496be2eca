"""The seq streams of a pipeline: its results (keyed by the pipeline's name) and its events (own seq,
own topic, keyed "<pipeline>/events" in the spool, in stats messages and in the ingest database)."""

from __future__ import annotations

EVENTS = "events"  # the `stream` field of an event message
RESULTS = "results"  # the `stream` a gap message names for a pipeline's results


def events_key(pipeline: str) -> str:
    """The seq stream (spool key) of a pipeline's events."""
    return f"{pipeline}/{EVENTS}"
