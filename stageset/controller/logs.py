"""Logging: one line per event, JSON or text, each carrying what the reconcile is about.

Identity: none; this module only formats what the process logs.

The per-reconcile fields live in :mod:`contextvars`, set with :func:`bind` where they become
known -- the manager binds the object and a reconcile id, a stage's work binds the stage,
its revision and the identity kind -- and :class:`ContextFilter` copies them onto every
record, whichever module logs.  Threads started for a reconcile must carry its context
(``contextvars.copy_context().run``), as the stage scheduler does.

Fields (JSON keys; the text format appends them as ``key=value``): ``stageset``,
``gitrepository``, ``stagetarget`` or ``fleetrollout`` (``namespace/name`` of the object reconciled;
``/name`` for a cluster-scoped one), ``reconcileID`` (one per
reconcile, as controller-runtime's), ``stage``, ``revision``, ``identity`` (``controller`` or
``tenant`` -- never the ServiceAccount's name).

Secret values never reach a line: :class:`~stageset.controller.redact.LogRedactor` runs on
the handler before either formatter, and the JSON formatter writes the redacted traceback
it leaves.  The ``kubernetes`` and ``urllib3`` loggers (request bodies at DEBUG) are held at
WARNING and ERROR, and dulwich's "object filtering not recognized by server" warning is dropped: the
partial-clone filter is an optimisation, our own limits bound what a server may send
(``docs/sources.md``), and the line told users nothing they could act on.

JSON comes from ``python-json-logger``: the whole project logs through the standard
``logging`` module (as do the kubernetes client and dulwich), so a formatter is all JSON
needs; structlog would add a second logging API for the same lines.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from pythonjsonlogger.json import JsonFormatter as _JsonFormatter

from stageset.controller.redact import install_log_filter

FIELDS = ("stageset", "gitrepository", "stagetarget", "fleetrollout", "stage", "revision", "identity",
          "reconcileID")
_VARS: dict[str, contextvars.ContextVar[str | None]] = {
    field: contextvars.ContextVar(f"stageset_log_{field}", default=None) for field in FIELDS}

FORMATS = ("json", "text")
LEVELS = ("debug", "info", "warn", "warning", "error")  # warn: the reference's spelling


def new_reconcile_id() -> str:
    return str(uuid.uuid4())


@contextlib.contextmanager
def bind(**fields: str | None) -> Iterator[None]:
    """Set log fields for the code inside (and the threads it starts with this context)."""
    unknown = set(fields) - set(FIELDS)
    if unknown:
        raise ValueError(f"unknown log fields: {sorted(unknown)}")
    tokens = [(_VARS[field], _VARS[field].set(value)) for field, value in fields.items()]
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


def current() -> dict[str, str]:
    """The fields bound now (unset ones left out)."""
    return {field: value for field, var in _VARS.items() if (value := var.get()) is not None}


class ContextFilter(logging.Filter):
    """Copies the bound fields onto each record (as attributes the formatters read)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for field, value in current().items():
            if not hasattr(record, field):
                setattr(record, field, value)
        return True


class DulwichFilter(logging.Filter):
    """Drops dulwich's warning that a server ignores the partial-clone filter (see the module doc)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name.startswith("dulwich")
                    and str(record.msg).startswith("object filtering not recognized"))


class JsonFormatter(_JsonFormatter):
    """``{"time", "level", "logger", "message", <fields>...}``; the traceback as ``exc_info``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s",
                         rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
                         json_ensure_ascii=False)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        del datefmt
        return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")

    def format(self, record: logging.LogRecord) -> str:
        if record.exc_info and record.exc_text:
            # The redaction filter left a redacted traceback in exc_text: write that one, not a
            # fresh rendering of exc_info.
            exc_info, record.exc_info = record.exc_info, None
            try:
                return super().format(record)
            finally:
                record.exc_info = exc_info
        return super().format(record)

    def process_log_record(self, log_data: dict[str, Any]) -> dict[str, Any]:
        log_data["level"] = str(log_data.get("level", "")).lower()
        return log_data


class TextFormatter(logging.Formatter):
    """``time LEVEL logger: message key=value ...``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = [f"{field}={value}" for field in FIELDS if (value := getattr(record, field, None))]
        if not fields:
            return text
        head, sep, tail = text.partition("\n")  # a traceback stays below the fields
        return f"{head} {' '.join(fields)}{sep}{tail}"


class ProgressFormatter(logging.Formatter):
    """``[HH:MM:SS] warning: message (key=value ...)``: the local demo's (``make run``) log lines, in
    the shape of its progress lines, so the two read as one stream."""

    def __init__(self) -> None:
        super().__init__("[%(asctime)s] %(levelname)s: %(message)s", datefmt="%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        record.levelname = record.levelname.lower()
        text = super().format(record)
        fields = [f"{field}={value}" for field in FIELDS if (value := getattr(record, field, None))]
        if not fields:
            return text
        head, sep, tail = text.partition("\n")
        return f"{head} ({' '.join(fields)}){sep}{tail}"


PROGRESS = "progress"
"""The demo's own format (not a ``--log-format`` choice)."""


def setup(*, level: str = "info", fmt: str = "text") -> None:
    """Configure the root logger once for the process: one stderr handler, the chosen format,
    Secret values redacted, the per-reconcile fields attached."""
    if fmt not in (*FORMATS, PROGRESS):
        raise ValueError(f"unknown log format {fmt!r} (use {' or '.join(FORMATS)})")
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else ProgressFormatter() if fmt == PROGRESS
                         else TextFormatter())
    handler.addFilter(ContextFilter())
    handler.addFilter(DulwichFilter())
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
    # Secret values (substituted into manifests, echoed by apiservers) never reach the log.
    install_log_filter()
    # The kubernetes client logs request bodies at DEBUG, which may include Secrets; urllib3's
    # warnings (retries, full pools) repeat what our own lines say about the same request.
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    logging.getLogger("dulwich").setLevel(logging.WARNING)
