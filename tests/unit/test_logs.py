"""Log formats, the per-reconcile fields, and what never reaches a line."""

from __future__ import annotations

import contextvars
import io
import json
import logging
import re
import threading
from collections.abc import Iterator

import pytest

from stageset.controller import logs
from stageset.controller.redact import REGISTRY


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    stream = io.StringIO()
    try:
        yield stream
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in saved[0]:
            root.addHandler(handler)
        root.setLevel(saved[1])
        REGISTRY.drop("test-owner")


def configure(stream: io.StringIO, fmt: str) -> None:
    logs.setup(level="debug", fmt=fmt)
    handler = logging.getLogger().handlers[0]
    handler.setStream(stream)  # type: ignore[attr-defined]


def test_json_lines_carry_the_bound_fields_also_in_threads_started_with_the_context(
    captured: io.StringIO,
) -> None:
    configure(captured, "json")
    log = logging.getLogger("stageset.test")
    with logs.bind(stageset="shop/web", reconcileID="r-1"):
        log.info("outside a stage")
        with logs.bind(stage="app", revision="main@sha1:abc", identity="tenant"):
            worker = threading.Thread(target=contextvars.copy_context().run, args=(log.info, "in a thread"))
            worker.start()
            worker.join()
    log.info("after")
    lines = [json.loads(line) for line in captured.getvalue().splitlines()]
    assert [(e["message"], e["level"], e["logger"]) for e in lines] == [
        ("outside a stage", "info", "stageset.test"),
        ("in a thread", "info", "stageset.test"),
        ("after", "info", "stageset.test"),
    ]
    assert {k: lines[1][k] for k in ("stageset", "stage", "revision", "identity", "reconcileID")} == {
        "stageset": "shop/web",
        "stage": "app",
        "revision": "main@sha1:abc",
        "identity": "tenant",
        "reconcileID": "r-1",
    }
    assert "stage" not in lines[0]
    assert "stageset" not in lines[2]
    assert lines[0]["time"].endswith("+00:00")


def test_text_lines_append_the_fields(captured: io.StringIO) -> None:
    configure(captured, "text")
    with logs.bind(stageset="shop/web", stage="app"):
        logging.getLogger("stageset.test").warning("denied: %s", "x")
    line = captured.getvalue().strip()
    assert line.endswith("WARNING stageset.test: denied: x stageset=shop/web stage=app")


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_secret_values_leave_no_trace_even_in_tracebacks(captured: io.StringIO, fmt: str) -> None:
    configure(captured, fmt)
    REGISTRY.set("test-owner", ["hunter2-secret-value"])
    log = logging.getLogger("stageset.test")
    try:
        raise RuntimeError("the apiserver said: hunter2-secret-value")
    except RuntimeError:
        log.exception("failed with %s", "hunter2-secret-value")
    text = captured.getvalue()
    assert "hunter2-secret-value" not in text
    assert "***" in text
    assert "RuntimeError" in text  # the traceback is there, redacted


def test_dulwichs_filter_warning_is_dropped_and_nothing_else(captured: io.StringIO) -> None:
    configure(captured, "json")
    logging.getLogger("dulwich.client").warning("object filtering not recognized by server, ignoring")
    logging.getLogger("dulwich.client").warning("something else")
    logging.getLogger("stageset.test").info("object filtering not recognized is fine from us")
    messages = [json.loads(line)["message"] for line in captured.getvalue().splitlines()]
    assert messages == ["something else", "object filtering not recognized is fine from us"]


def test_clients_stay_quiet(captured: io.StringIO) -> None:
    configure(captured, "json")
    logging.getLogger("urllib3.connectionpool").warning("Retrying (Retry(total=2))")
    logging.getLogger("kubernetes.client.rest").debug("response body: {...}")
    assert captured.getvalue() == ""


def test_unknown_fields_and_formats_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown log fields"), logs.bind(serviceAccount="x"):
        pass
    with pytest.raises(ValueError, match="unknown log format"):
        logs.setup(fmt="xml")


def test_the_demo_s_lines_have_the_shape_of_its_progress_lines(captured: io.StringIO) -> None:
    """``make run`` (issue 50): a warning reads ``[HH:MM:SS] warning: ...`` like the demo's own lines,
    never Python's ``2026-... WARNING name: ...``; the bound fields follow in brackets."""
    configure(captured, logs.PROGRESS)
    with logs.bind(stageset="shop/shop"):
        logging.getLogger("stageset.controller.x").warning("the source is not ready yet")
    line = captured.getvalue().strip()
    assert re.fullmatch(r"\[\d\d:\d\d:\d\d\] warning: the source is not ready yet \(stageset=shop/shop\)",
                        line), line
    with pytest.raises(ValueError, match="unknown log format"):
        logs.setup(fmt="fancy")
