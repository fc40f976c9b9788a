"""E2B's template build API on the front (docs/e2b.rst, "Building templates"), driven by the
unmodified SDK against a real daemon as root: ``Template.build`` (sync and async) and
``build_in_background`` FROM a template imported in the test (busybox and bash), ``copy`` of
local files uploaded to the front, ``set_envs``, ``run_cmd`` as root, ``set_workdir``; the
logs polled, a failed step named, aliases and tags; then ``Sandbox.create`` from what was
built sees the copied files and the env. Nothing is downloaded."""

import asyncio
import json
import linecache
import os
import socket
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import AsyncTemplate, BuildException, Sandbox, Template, TemplateException
from e2b.template.logger import LogEntry
from e2b.template.main import TemplateClass

from tests.e2b.conftest import TOKEN, E2BDaemon, point_sdk_at, running_front
from tests.e2b.test_templates import native
from tests.templates.rootfs import rootfs

BASE = "e2b-build-base"


@pytest.fixture(scope="module")
def base(isolated_front: E2BDaemon) -> Iterator[E2BDaemon]:
    """The daemon with the base template (busybox, bash); every template built here removed
    after."""
    assert native(isolated_front, "PUT", f"/templates/{BASE}", rootfs("/bin/bash")) == 201
    try:
        yield isolated_front
    finally:
        for name in names(isolated_front):
            if name.startswith(("e2b-built-", BASE)):
                native(isolated_front, "DELETE", f"/templates/{name}")


def names(front: E2BDaemon) -> list[str]:
    request = urllib.request.Request(
        front.daemon.url + "/templates", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return [t["name"] for t in json.load(response)["templates"]]


@pytest.fixture
def front(monkeypatch: pytest.MonkeyPatch, base: E2BDaemon) -> E2BDaemon:
    return point_sdk_at(monkeypatch, base)


def unique() -> str:
    return f"e2b-built-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def context(tmp_path: Path) -> Path:
    (tmp_path / "hello.txt").write_text("hello from the context\n")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "a.txt").write_text("a\n")
    (tmp_path / "folder" / "b.txt").write_text("b\n")
    (tmp_path / "folder" / "skip.md").write_text("not copied\n")
    (tmp_path / "run.sh").write_text("#!/bin/sh\necho ran as $(whoami)\n")
    (tmp_path / "big.bin").write_bytes(os.urandom(300_000))  # spooled by the site: on disk
    return tmp_path


def test_the_sdk_builds_a_template_and_a_sandbox_runs_in_it(
    front: E2BDaemon, context: Path
) -> None:
    name = unique()
    template = (
        Template(file_context_path=str(context))
        .from_template(BASE)
        .copy("hello.txt", "/opt/app/")
        .copy("big.bin", "/opt/big.bin")
        .copy("folder/*.txt", "/opt/folder")
        .copy("run.sh", "/opt/app/run.sh", mode=0o755)
        .set_envs({"GREETING": "hi there", "EMPTY": ""})
        .run_cmd("cat /opt/app/hello.txt > /opt/app/seen && echo built-$GREETING")
        .set_workdir("/opt/app")
        .run_cmd("pwd > where", user="root")
    )
    logs: list[LogEntry] = []
    info = Template.build(template, name, on_build_logs=logs.append)
    assert info.name == name and info.template_id == name
    messages = [entry.message for entry in logs]
    assert "built-hi there" in messages, messages
    assert any("COPY" in m for m in messages) and any(m.startswith("built ") for m in messages)

    sbx = Sandbox.create(template=name, timeout=120, allow_internet_access=False)
    try:
        run = sbx.commands.run
        assert run("cat /opt/app/hello.txt").stdout == "hello from the context\n"
        assert run("cat /opt/app/seen /opt/app/where").stdout == (
            "hello from the context\n/opt/app\n"
        )
        assert run("ls /opt/folder").stdout.split() == ["a.txt", "b.txt"]
        assert run("echo $GREETING").stdout == "hi there\n"
        assert run("/opt/app/run.sh").stdout == "ran as user\n"
        assert run("stat -c %s /opt/big.bin").stdout == "300000\n"
    finally:
        sbx.kill()


def test_the_async_sdk_builds_from_an_image_naming_a_template(front: E2BDaemon) -> None:
    name = f"{unique()}:v1"

    async def build() -> tuple[bool, bool, bool, bool]:
        template = AsyncTemplate().from_image(BASE).run_cmd(["echo one", "echo two"])
        logs: list[LogEntry] = []
        await AsyncTemplate.build(template, name, on_build_logs=logs.append)
        assert "two" in [entry.message for entry in logs]
        return (
            await AsyncTemplate.exists(name.partition(":")[0]),
            await AsyncTemplate.alias_exists(name),
            await AsyncTemplate.exists("base"),
            await AsyncTemplate.exists(f"nonexistent-{uuid.uuid4()}"),
        )

    assert asyncio.run(build()) == (True, True, True, False)
    assert name in names(front)


def test_a_failed_run_names_its_step_and_leaves_nothing(front: E2BDaemon) -> None:
    name = unique()
    template = Template().from_template(BASE).run_cmd("echo fine")
    template = template.run_cmd("echo boom; exit 3")  # the failing step's own line
    logs: list[LogEntry] = []
    with pytest.raises(BuildException, match=r"RUN .*exited with 3") as failed:
        Template.build(template, name, on_build_logs=logs.append)
    # The reason's step (2) is how the SDK finds the line of the program that added it.
    lines, trace = [], failed.value.__traceback__
    while trace is not None:
        lines.append(linecache.getline(trace.tb_frame.f_code.co_filename, trace.tb_lineno))
        trace = trace.tb_next
    assert any("the failing step's own line" in line for line in lines), lines
    assert "boom" in [entry.message for entry in logs]
    assert not Template.exists(name)


def test_a_build_in_background_is_polled_to_its_end(front: E2BDaemon) -> None:
    name = unique()
    template = (
        Template().from_template(BASE).run_cmd("echo in the background").set_ready_cmd("true")
    )
    info = Template.build_in_background(template, name)
    deadline = time.monotonic() + 60
    status = Template.get_build_status(info)
    while status.status.value in ("waiting", "building") and time.monotonic() < deadline:
        time.sleep(0.1)
        status = Template.get_build_status(info)
    assert status.status.value == "ready", status
    every = Template.get_build_status(info, logs_offset=0)
    messages = [entry.message for entry in every.log_entries]
    assert "in the background" in messages and "the ready command is not run" in messages[0]
    assert Template.get_build_status(info, logs_offset=len(every.log_entries)).log_entries == []


def test_tags_are_names_of_the_template(front: E2BDaemon) -> None:
    name = unique()
    Template.build(Template().from_template(BASE), f"{name}:v1", tags=["stable"])
    assigned = Template.assign_tags(f"{name}:v1", ["prod", f"{name}:latest"])
    assert assigned.tags == ["prod", "latest"] and assigned.build_id
    tags = sorted(tag.tag for tag in Template.get_tags(name))
    assert tags == ["latest", "prod", "stable", "v1"]
    assert Template.assign_tags(f"{name}:v1", "v1").tags == ["v1"]  # itself: nothing to do
    Template.remove_tags(name, ["prod", "latest"])
    assert sorted(tag.tag for tag in Template.get_tags(name)) == ["stable", "v1"]
    with pytest.raises(TemplateException):
        Template.assign_tags(f"{name}:v1", ":invalid-tag")
    with pytest.raises(TemplateException):
        Template.assign_tags(f"{name}:v1", f"{name}:")
    sbx = Sandbox.create(template=f"{name}:stable", timeout=60, allow_internet_access=False)
    try:
        assert sbx.commands.run("echo tagged").stdout == "tagged\n"
    finally:
        sbx.kill()


def test_a_tag_taken_while_building_fails_the_build(front: E2BDaemon) -> None:
    name = unique()
    template = Template().from_template(BASE).run_cmd("sleep 1")
    info = Template.build_in_background(template, f"{name}:v1", tags=["v2"])
    assert native(front, "PUT", f"/templates/{name}:v2", rootfs()) == 201
    deadline = time.monotonic() + 60
    status = Template.get_build_status(info)
    while status.status.value != "error" and time.monotonic() < deadline:
        time.sleep(0.1)
        status = Template.get_build_status(info)
    assert status.reason is not None
    assert f"the template's name '{name}:v2'" in status.reason.message
    assert status.reason.step == "base"


@pytest.mark.parametrize(
    ("template", "message"),
    [
        (Template().from_image("ubuntu:22.04"), "image 'ubuntu:22.04' is no template"),
        (Template().from_template("nope-nothing"), "no template named 'nope-nothing'"),
        (
            Template().from_template(BASE).set_start_cmd("sleep 1", "true"),
            "start command",
        ),
        (Template().from_template(BASE).set_user("nobody"), "step 1: user 'nobody'"),
    ],
)
def test_what_does_not_map_is_refused_naming_the_step(
    front: E2BDaemon, template: TemplateClass, message: str
) -> None:
    with pytest.raises(BuildException, match=message):
        Template.build(template, unique())


def test_an_upload_without_its_link_is_refused_at_its_headers(front: E2BDaemon) -> None:
    """A link the front never gave, a gigabyte announced and never sent: refused at once,
    before a byte of the body is read or stored (the site would otherwise wait for it)."""
    path = f"/templates/x/files/{'0' * 64}/upload?build=nope&token=nope"
    head = f"PUT {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {1 << 30}\r\n\r\n"
    port = int(front.url.rpartition(":")[2])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(head.encode())
        answer = connection.recv(65536)
    assert answer.startswith(b"HTTP/1.1 401 "), answer
    assert b"Invalid API key or access token" in answer


@pytest.fixture(scope="module")
def networked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2BDaemon]:
    """A daemon whose E2B builds' RUN steps have the host's network."""
    with running_front(tmp_path_factory.mktemp("e2b-build-net"), "--build-network=host") as daemon:
        assert native(daemon, "PUT", f"/templates/{BASE}", rootfs("/bin/bash")) == 201
        yield daemon


def test_run_steps_reach_the_network_only_where_the_operator_says(
    monkeypatch: pytest.MonkeyPatch, front: E2BDaemon, networked: E2BDaemon
) -> None:
    """``SANDBOXD_BUILD_NETWORK=host`` (what the SDK's ``pip_install`` needs): a RUN step
    reaches a server on the host's loopback; by default it reaches nothing."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        knock = f"bash -c 'echo knock > /dev/tcp/127.0.0.1/{port}'"
        template = Template().from_template(BASE).run_cmd(knock)
        with pytest.raises(BuildException, match="exited with"):
            Template.build(template, unique())  # the default daemon: network none
        point_sdk_at(monkeypatch, networked)
        Template.build(template, unique())
        server.settimeout(30)
        connection, _ = server.accept()
        with connection:
            assert connection.recv(16) == b"knock\n"
