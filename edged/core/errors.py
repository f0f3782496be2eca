"""The one exception hierarchy. Library errors are converted at the boundary with `raise ... from`."""

from __future__ import annotations


class EdgedError(Exception):
    """Base of every error edged raises on purpose; the CLI prints its message and exits non-zero."""


class ConfigError(EdgedError):
    """The configuration is invalid. `problems` holds one `file:line key=value: message` line each."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


class ModelError(EdgedError):
    """A model file is missing, malformed, or does not fit the pipeline's pre/postprocessing."""


class RefusedResultError(ModelError):
    """One frame's model outputs do not fit the decoder's reading (a shape, a class beyond the labels, boxes that
    are not boxes): that frame's result is refused, counted and reported, never published."""


class ProviderError(EdgedError):
    """The execution provider asked for is not available and the config requires it."""


class SourceError(EdgedError):
    """A frame source cannot be opened or has failed."""


class SpoolError(EdgedError):
    """The durable spool cannot be opened or written."""


class StatusError(EdgedError):
    """The status socket cannot be reached or served."""


class SecretError(EdgedError):
    """A key or password file is missing or readable by others."""


class ToolError(EdgedError):
    """A model tool (inspect, quantize, validate, bench, budget) cannot do what was asked."""


class IngestError(EdgedError):
    """The ingest's database cannot be opened or written, or its broker refuses it."""


class IngestDataError(IngestError):
    """The ingest's database refused the data itself (a value out of its range): retrying cannot help."""


class CommandError(EdgedError):
    """A remote command is refused: unsigned, wrongly signed, replayed, stale, too large or malformed."""

    def __init__(self, reason: str, message: str, detail: object = None) -> None:
        self.reason = reason  # a short key the counters use: "unsigned", "bad_signature", "replayed", ...
        self.detail = detail  # what the answer carries besides the message (a rollout's check report)
        super().__init__(message)


class InputError(EdgedError, ValueError):
    """Bytes from outside (a message from the broker, a pushed config, a fetched file) that edged refuses to
    read: too large, too deep, not JSON, a number out of range. `reason` is a short key counters use."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)
