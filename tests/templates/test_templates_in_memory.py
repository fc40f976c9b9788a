"""The template routes on the in-memory harness (``tests.http``): a replica without a store
answers ``503`` on each and does not list the capability; with one, a body read from
memory (below the spool's size) is imported like a spooled one."""

import pytest

from sandboxd.http.api import SandboxAPI
from tests.http.conftest import harness, settings, token  # noqa: F401 (fixtures)
from tests.http.http_harness import Harness
from tests.templates.archives import file, tar


def test_a_small_body_is_imported_from_memory(harness: Harness) -> None:  # noqa: F811
    reply = harness.call("PUT", "/templates/tiny", data=tar([file("a", b"b")]))
    assert reply.status == 201, reply
    assert reply.json()["size"] == 1
    assert "templates" in harness.api.capabilities


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/templates"),
        ("GET", "/templates/x"),
        ("PUT", "/templates/x"),
        ("DELETE", "/templates/x"),
    ],
)
def test_without_a_store_every_route_is_a_503(
    harness: Harness,  # noqa: F811
    method: str,
    path: str,
) -> None:
    harness.api.templates = None
    reply = harness.call(method, path, data=b"")
    assert reply.error() == (503, "TemplatesUnavailable")
    assert reply.json()["detail"] == "templates are not available on this replica"
    assert "templates" not in SandboxAPI(harness.manager).capabilities


def test_each_route_has_an_endpoint_of_its_own() -> None:
    """Klein names a route's endpoint after its function: two route functions of one name
    (a ``delete`` of templates beside the files' ``delete``) would serve one route with the
    other's function."""
    rules = list(SandboxAPI.app.url_map.iter_rules())
    assert len({rule.endpoint for rule in rules}) == len(rules)
