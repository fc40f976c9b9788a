"""E2B's template build API (docs/e2b.rst, "Building templates") where it refuses: the steps
that do not map read by :func:`~sandboxd.e2b.template_steps.read_plan`, the context assembled
from uploads, and each route's refusals on the front in memory (its own checks, as with
``SANDBOXD_AUTH_GATE=off``); what is kept of builds bounded. The builds themselves, for real:
tests/e2b/test_e2b_template_build.py."""

import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandboxd.e2b import template_builds
from sandboxd.e2b.api import make_front
from sandboxd.e2b.template_builds import TemplateBuilds
from sandboxd.e2b.template_steps import Copy, assemble_context, read_plan
from sandboxd.e2b.wire import RestError
from sandboxd.errors import BadArchive
from tests.e2b.memory import KEY, Memory, memory_front
from tests.http.http_harness import result_of
from tests.templates.archives import directory, file, link, tar

HASH = "a" * 64


def plan_of(**body: Any) -> Any:
    return read_plan({"fromTemplate": "base-t", **body}, lambda name: name == "base-t")


def step(kind: str, *args: str, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "args": list(args), **extra}


# The steps


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"fromImageRegistry": {"type": "registry"}}, "the template's base: a registry's image"),
        ({"fromTemplate": None, "fromImage": 7}, "fromTemplate or fromImage: must be"),
        ({"steps": {"not": "a list"}}, "steps: must be a list"),
        ({"steps": ["RUN x"]}, "step 1: must be an object"),
        ({"steps": [{"type": "RUN", "args": [1]}]}, "step 1: args: must be a list of strings"),
        ({"steps": [step("ARG", "x")]}, "step 1: instruction 'ARG' is not supported"),
        ({"steps": [step("RUN", " ")]}, "step 1: RUN needs a command"),
        ({"steps": [step("RUN", "id", "nobody")]}, "step 1: user 'nobody' is not available"),
        ({"steps": [step("COPY", "a")]}, "COPY needs a source and a destination"),
        ({"steps": [step("COPY", "a", "/b")]}, "COPY needs its files' hash"),
        ({"steps": [step("COPY", "a", "/b", "", "rwx", filesHash=HASH)]}, "mode 'rwx'"),
        ({"steps": [step("COPY", "a\nb", "/b", filesHash=HASH)]}, "a line break or a tab"),
        ({"steps": [step("COPY", "a", "/b", "bin", filesHash=HASH)]}, "user 'bin'"),
        ({"steps": [step("ENV", "A")]}, "ENV needs pairs"),
        ({"steps": [step("ENV", "A=B", "c")]}, "ENV: 'A=B' is not a variable's name"),
        ({"steps": [step("ENV", "A", "1\n2")]}, "ENV A: a value may not hold a line break"),
        ({"steps": [step("WORKDIR", "/a b")]}, "WORKDIR takes one path"),
        ({"steps": [step("USER")]}, "user '?'"),
    ],
)
def test_a_step_that_does_not_map_is_refused_by_its_number(
    body: dict[str, Any], message: str
) -> None:
    with pytest.raises(RestError, match=message) as refused:
        plan_of(**body)
    assert refused.value.status == 400


def test_the_steps_become_the_builders_dockerfile() -> None:
    plan = plan_of(
        readyCmd="true",
        steps=[
            step("USER", "root"),
            step("ENV"),
            step("ENV", "A", 'say "hi"', "B", ""),
            step("COPY", "x/*.txt", "/d", "user:user", "0755", filesHash=HASH),
            step("RUN", "echo $A", "user"),
            step("WORKDIR", "/w"),
        ],
    )
    assert plan.notes == ("the ready command is not run: a sandboxd sandbox is ready once created",)
    text, steps = plan.dockerfile({"e2b-copy-4": ["e2b-copy-4/x/a.txt", "e2b-copy-4/x/b.txt"]})
    assert text.splitlines() == [
        "FROM base-t",
        'ENV A="say \\"hi\\"" B=""',
        'COPY ["e2b-copy-4/x/a.txt", "e2b-copy-4/x/b.txt", "/d/"]',
        'RUN ["chmod", "0755", "/d/a.txt"]',
        'RUN ["chmod", "0755", "/d/b.txt"]',
        'RUN ["/bin/sh", "-c", "echo $A"]',
        "WORKDIR /w",
    ]
    assert steps == ["base", "3", "4", "4", "4", "5", "6"]


def test_a_debian_image_is_the_builders_and_others_are_refused() -> None:
    assert read_plan({"fromImage": "debian:bookworm"}, lambda name: False).base == "debian:bookworm"
    with pytest.raises(RestError, match="no template named 'debian:x'") as unknown:
        read_plan({"fromTemplate": "debian:x"}, lambda name: False)
    assert unknown.value.status == 404


def upload(entries: list[Any], compression: str = "gz") -> io.BytesIO:
    return io.BytesIO(tar(entries, compression))


def copy(source: str, number: str = "1") -> Copy:
    return Copy(number, HASH, f"e2b-copy-{number}", source, "/d", "")


def test_the_context_holds_each_upload_under_its_step() -> None:
    first = upload([directory("dir"), file("dir/a", b"A"), link("dir/h", "dir/a", hard=True)])
    second = upload([file("x.txt", b"x"), file("y.txt", b"y"), file("z.md")], "")
    target = io.BytesIO()
    found = assemble_context(target, [(copy("dir"), first), (copy("*.txt", "2"), second)])
    assert found == {
        "e2b-copy-1": ["e2b-copy-1/dir"],
        "e2b-copy-2": ["e2b-copy-2/x.txt", "e2b-copy-2/y.txt"],
    }
    target.seek(0)
    with tarfile.open(fileobj=target) as context:
        members = {m.name: m for m in context.getmembers()}
        assert members["e2b-copy-1/dir/h"].linkname == "e2b-copy-1/dir/a"
        data = context.extractfile(members["e2b-copy-2/y.txt"])
        assert data is not None and data.read() == b"y"


@pytest.mark.parametrize(
    ("entries", "source", "message"),
    [
        ([file("a.txt")], "*.md", "step 1: COPY \\*.md: no file matches"),
        ([file("../out")], "a", "its path holds '..'"),
    ],
)
def test_an_upload_that_cannot_be_copied_is_refused(
    entries: list[Any], source: str, message: str
) -> None:
    with pytest.raises(BadArchive, match=message):
        assemble_context(io.BytesIO(), [(copy(source), upload(entries))])


def test_an_upload_that_is_no_tar_is_refused() -> None:
    with pytest.raises(BadArchive, match="step 1: its files are not a tar"):
        assemble_context(io.BytesIO(), [(copy("a"), io.BytesIO(b"\x1f\x8b not gzip"))])


# The routes, in memory


@pytest.fixture
def memory(tmp_path: Path) -> Iterator[Memory]:
    yield from memory_front(str(tmp_path))


def status_of(reply: Any) -> tuple[int, str]:
    body = reply.json()
    assert body["code"] == reply.status, body
    return reply.status, body["message"]


def requested(memory: Memory, name: str = "t-mem", **body: Any) -> dict[str, Any]:
    reply = memory.control("POST", "/v3/templates", {"name": name, **body})
    assert reply.status == 202, reply
    answer: dict[str, Any] = reply.json()
    return answer


def import_template(memory: Memory, name: str) -> None:
    assert memory.front.templates is not None
    archive = tar([directory("bin"), file("bin/x", b"x")])
    result_of(memory.front.templates.put(name, io.BytesIO(archive)))


def test_a_build_request_is_refused_when_it_cannot_be_made(memory: Memory) -> None:
    post = memory.control
    assert status_of(post("POST", "/v3/templates", {"name": 7})) == (
        400,
        "name: must be a template's name",
    )
    assert status_of(post("POST", "/v3/templates", {"name": "A"}))[0] == 400
    assert status_of(post("POST", "/v3/templates", {"name": "t", "tags": "v1"})) == (
        400,
        "tags: must be a list of strings",
    )
    assert status_of(post("POST", "/v3/templates", {"name": "t", "tags": ["-"]}))[0] == 400
    malformed = memory.call("POST", "/v3/templates", data=b"{", headers={"X-API-Key": "e2b-key"})
    assert malformed.status == 400
    import_template(memory, "t-taken:v2")
    taken = post("POST", "/v3/templates", {"name": "t-taken:v1", "tags": ["v1", "v2"]})
    assert status_of(taken) == (409, "template 't-taken:v2' exists (delete it first)")
    build = requested(memory, "t-new:v1", tags=["v1", "v3"])
    assert (build["names"], build["tags"], build["aliases"]) == (
        ["t-new:v1", "t-new:v3"],
        ["v1", "v3"],
        ["t-new"],
    )


def test_uploads_are_for_a_waiting_build_with_its_token(memory: Memory) -> None:
    assert status_of(memory.control("GET", f"/templates/t-mem/files/{HASH}"))[0] == 404
    build = requested(memory)
    assert status_of(memory.control("GET", "/templates/t-mem/files/nothex"))[0] == 400
    link = memory.control("GET", f"/templates/t-mem/files/{HASH}")
    assert link.status == 201 and link.json()["present"] is False
    url = link.json()["url"]
    assert url.startswith(f"http://e2b.test/templates/t-mem/files/{HASH}/upload?build=")
    path = url.removeprefix("http://e2b.test")
    wrong = path.rpartition("token=")[0] + "token=nope"
    assert status_of(memory.call("PUT", wrong, data=b"x"))[0] == 401
    elsewhere = path.replace("/templates/t-mem/", "/templates/t-other/")
    assert status_of(memory.call("PUT", elsewhere, data=b"x"))[0] == 404
    other_hash = path.replace(HASH, "b" * 64)
    assert status_of(memory.call("PUT", other_hash, data=b"x"))[0] == 404
    assert memory.call("PUT", path, data=tar([file("a")])).status == 200
    assert memory.call("PUT", path, data=tar([file("b")])).status == 200  # replaces
    builds = memory.front.builds
    assert builds is not None
    kept = builds.builds[build["buildID"]].uploads[HASH]
    assert kept is not None
    with tarfile.open(fileobj=kept) as uploaded:
        assert uploaded.getnames() == ["b"]


def test_a_build_takes_a_bounded_number_of_uploads(
    memory: Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(template_builds, "UPLOADS_MAX", 1)
    requested(memory)
    assert memory.control("GET", f"/templates/t-mem/files/{HASH}").status == 201
    assert memory.control("GET", f"/templates/t-mem/files/{HASH}").status == 201  # the same
    refused = memory.control("GET", f"/templates/t-mem/files/{'b' * 64}")
    assert status_of(refused) == (400, "a build takes at most 1 uploads")


def test_a_trigger_that_does_not_map_fails_the_build(memory: Memory) -> None:
    build = requested(memory)
    trigger = f"/v2/templates/t-mem/builds/{build['buildID']}"
    assert status_of(memory.control("POST", "/v2/templates/t-mem/builds/nope", {}))[0] == 404
    assert (
        status_of(memory.control("POST", f"/v2/templates/other/builds/{build['buildID']}"))[0]
        == 404
    )
    memory.control("GET", f"/templates/t-mem/files/{HASH}")
    body = {"fromImage": "base-none", "steps": [step("COPY", "a", "/b", filesHash=HASH)]}
    assert status_of(memory.control("POST", trigger, body))[0] == 400
    body["fromTemplate"] = "t-base"
    import_template(memory, "t-base")
    assert status_of(memory.control("POST", trigger, body)) == (
        409,
        f"build {build['buildID']} was started already",
    )
    status = memory.control("GET", f"/templates/t-mem/builds/{build['buildID']}/status")
    assert status.status == 200
    answer = status.json()
    assert answer["status"] == "error" and answer["reason"]["step"] == "base"
    assert "image 'base-none' is no template" in answer["reason"]["message"]


def test_files_not_uploaded_fail_the_build(memory: Memory) -> None:
    import_template(memory, "t-base")
    build = requested(memory)
    body = {"fromTemplate": "t-base", "steps": [step("COPY", "a", "/b", filesHash=HASH)]}
    trigger = memory.control("POST", f"/v2/templates/t-mem/builds/{build['buildID']}", body)
    assert status_of(trigger) == (400, "step 1: its files were not uploaded")


def test_an_upload_that_is_no_tar_fails_the_build(memory: Memory) -> None:
    import_template(memory, "t-base")
    build = requested(memory)
    path = memory.control("GET", f"/templates/t-mem/files/{HASH}").json()["url"]
    assert memory.call("PUT", path.removeprefix("http://e2b.test"), data=b"junk").status == 200
    body = {"fromTemplate": "t-base", "steps": [step("COPY", "a", "/b", filesHash=HASH)]}
    trigger = memory.control("POST", f"/v2/templates/t-mem/builds/{build['buildID']}", body)
    status, message = status_of(trigger)
    assert status == 400 and message.startswith("step 1: its files are not a tar")
    builds = memory.front.builds
    assert builds is not None and builds.builds[build["buildID"]].status == "error"


def test_the_status_reads_its_log_from_an_offset(memory: Memory) -> None:
    build = requested(memory)
    builds = memory.front.builds
    assert builds is not None
    entry = builds.builds[build["buildID"]]
    for line in ("one", "two", "three"):
        builds._log(entry, "info", line, "1")
    path = f"/templates/t-mem/builds/{build['buildID']}/status"
    answer = memory.control("GET", path + "?logsOffset=1&limit=1").json()
    assert answer["status"] == "waiting" and "reason" not in answer
    assert [e["message"] for e in answer["logEntries"]] == ["two"]
    assert answer["logEntries"][0]["step"] == "1" and answer["logs"][0].endswith("] two")
    assert status_of(memory.control("GET", path + "?logsOffset=-1")) == (
        400,
        "logsOffset: must be a count",
    )


def test_aliases_and_tags_name_the_stores_templates(memory: Memory) -> None:
    assert memory.control("GET", "/templates/aliases/base").json() == {
        "templateID": "base",
        "public": False,
    }
    assert status_of(memory.control("GET", "/templates/aliases/t-none"))[0] == 404
    import_template(memory, "t-tag:v1")
    assert memory.control("GET", "/templates/aliases/t-tag").status == 200
    tags = memory.control("GET", "/templates/t-tag/tags").json()
    assert [(t["tag"], len(t["buildID"])) for t in tags] == [("v1", 36)]
    assert status_of(memory.control("GET", "/templates/t-none/tags"))[0] == 404
    post, delete = "POST", "DELETE"
    refusals = [
        (post, {"target": "t-none:v1", "tags": ["x"]}, 404),
        (post, {"target": "t-tag:v1", "tags": []}, 400),
        (post, {"target": "t-tag:v1", "tags": ["other:x"]}, 400),
        (post, {"target": "t-tag:v1", "tags": [""]}, 400),
        (delete, {"name": "t-tag", "tags": ["v9"]}, 404),
    ]
    for method, body, code in refusals:
        assert status_of(memory.control(method, "/templates/tags", body))[0] == code, body


def test_a_replica_without_templates_builds_none(memory: Memory) -> None:
    bare = make_front(memory.manager, KEY.encode())  # a replica with no template store
    assert (bare.templates, bare.builds) == (None, None)
    memory.front.builds = None
    assert status_of(memory.control("POST", "/v3/templates", {"name": "t"})) == (
        400,
        "this sandboxd builds no templates (it has no template store)",
    )
    assert memory.control("GET", "/templates/aliases/t").status == 404
    assert memory.control("GET", "/templates/aliases/base").status == 200


# What is kept


def test_builds_are_bounded_and_forgotten_when_old(
    memory: Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(template_builds, "BUILDS_MAX", 2)
    builds = memory.front.builds
    assert isinstance(builds, TemplateBuilds)
    first = builds.request("t-one", [])
    builds.upload_link("t-one", HASH)  # asked, never uploaded
    second = builds.request("t-two", [])
    with pytest.raises(RestError, match="2 template builds are under way") as full:
        builds.request("t-three", [])
    assert full.value.status == 429
    second.status = template_builds.READY
    builds.request("t-three", [])  # the ended one is forgotten
    memory.clock.advance(template_builds.WAIT_MAX + 1)
    builds.request("t-four", [])  # and the one waiting too long
    assert first.id not in builds.builds and first.uploads == {}


def test_a_build_requested_again_replaces_the_one_waiting(memory: Memory) -> None:
    builds = memory.front.builds
    assert builds is not None
    first = builds.request("t-again", [])
    builds.upload_link("t-again", HASH)
    other = builds.request("t-other", [])
    second = builds.request("t-again", [])
    assert set(builds.builds) == {other.id, second.id} and first.uploads == {}


@pytest.mark.parametrize(("entries", "size"), [(2, 100), (100, 2)])
def test_a_builds_log_is_cut(
    memory: Memory, monkeypatch: pytest.MonkeyPatch, entries: int, size: int
) -> None:
    monkeypatch.setattr(template_builds, "LOG_MAX", entries)
    monkeypatch.setattr(template_builds, "LOG_BYTES_MAX", size)
    builds = memory.front.builds
    assert builds is not None
    build = builds.request("t-log", [])
    for number in range(4):
        builds._log(build, "info", str(number))
    cut = f"the log is cut here (at most {entries} entries, {size} bytes)"
    assert [e.message for e in build.log] == ["0", "1", cut]


def test_a_template_id_is_its_name_without_its_tag() -> None:
    assert template_builds.template_id_of("a:b") == "a"
    assert json.dumps(template_builds.template_id_of("a")) == '"a"'
