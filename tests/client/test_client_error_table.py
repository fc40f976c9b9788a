"""
The client's table of wire error types is the contract's (``docs/openapi.yaml``), and each type
becomes the exception docs/client.rst, "Errors and retries", names, whether it arrives as an HTTP
error or in band.

The daemon is tested against the same table, so the two cannot drift apart unnoticed.
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest
import yaml

from sandboxd_client import (
    ContextNotFound,
    ProcessNotFound,
    SandboxError,
    SandboxNotFound,
    SandboxUnavailable,
    TemplateNotFound,
    TooLarge,
)
from sandboxd_client._errors import FOREIGN_ERRORS, WIRE_ERRORS, error_for, error_from_frame

from .daemon_in_memory import daemon_error_table

OPENAPI = Path(__file__).resolve().parents[2] / "docs" / "openapi.yaml"


def _document() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(OPENAPI.read_text(encoding="utf-8"))
    return loaded


def documented_table() -> dict[str, int]:
    error = _document()["components"]["schemas"]["Error"]["properties"]["error"]
    table: dict[str, int] = error["x-error-types"]
    return table


EXPECTED: dict[str, type[BaseException]] = {
    "BadRequest": ValueError,
    "Unauthorized": PermissionError,
    "SandboxNotFound": SandboxNotFound,
    "FileNotFoundError": FileNotFoundError,
    "NotFound": SandboxNotFound,
    "ProcessNotFound": ProcessNotFound,
    "TemplateNotFound": TemplateNotFound,
    "ContextNotFound": ContextNotFound,
    "ContextsUnavailable": SandboxError,
    "MethodNotAllowed": SandboxError,
    "Conflict": SandboxError,
    "TooMany": SandboxError,
    "TooLarge": TooLarge,
    "InternalError": SandboxError,
    "ArchiveError": SandboxError,
    "NotImplemented": SandboxError,
    "PortClosed": SandboxError,
    "Draining": SandboxUnavailable,
    "NoCapacity": SandboxUnavailable,
    "TemplatesUnavailable": SandboxUnavailable,
    "InsufficientStorage": OSError,
}
"""What docs/client.rst, "Errors and retries", says an application gets for each type."""


def test_the_client_table_is_the_documented_table() -> None:
    assert dict(WIRE_ERRORS) == documented_table()
    assert not set(FOREIGN_ERRORS) & set(WIRE_ERRORS)


def test_the_documented_table_agrees_with_the_responses_the_routes_name() -> None:
    """A route answering ``"413": {$ref: .../responses/TooLarge}`` answers TooLarge with 413."""
    document, table = _document(), documented_table()
    seen = 0
    for operations in document["paths"].values():
        for operation in operations.values():
            if not isinstance(operation, dict):  # a path's shared ``parameters``
                continue
            for status, response in operation.get("responses", {}).items():
                name = response.get("$ref", "").rsplit("/", 1)[-1]
                if name in table:
                    assert table[name] == int(status), (name, status)
                    seen += 1
    assert seen > 0


ROUTING_ERRORS = {"NotFound", "MethodNotAllowed"}
"""Answered by the router (werkzeug's exception names), not from the daemon's table."""


def test_the_daemon_table_is_the_documented_table() -> None:
    documented = documented_table()
    assert daemon_error_table() == {t: s for t, s in documented.items() if t not in ROUTING_ERRORS}


def test_every_expected_exception_is_listed() -> None:
    assert set(EXPECTED) == set(documented_table())


@pytest.mark.parametrize("wire_type", sorted(EXPECTED))
def test_each_type_becomes_its_exception_as_http_error_and_in_band(wire_type: str) -> None:
    status = documented_table()[wire_type]
    expected = EXPECTED[wire_type]
    for raised in (error_for(status, wire_type, "d"), error_from_frame(wire_type, "d")):
        assert type(raised) is expected or (
            expected is OSError and type(raised) is OSError and raised.errno == errno.ENOSPC
        ), (wire_type, raised)
        if isinstance(raised, SandboxError):
            assert raised.error == wire_type and raised.detail == "d"


def test_an_in_band_error_has_no_status() -> None:
    frame = error_from_frame("InternalError", "boom")
    assert isinstance(frame, SandboxError) and frame.status is None
    http = error_for(500, "InternalError", "boom")
    assert isinstance(http, SandboxError) and http.status == 500
