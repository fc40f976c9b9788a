"""E2B's own template tests (e2b-dev/E2B, ``packages/python-sdk/tests/sync/template_sync``)
that reach a server, ported to run against the front (docs/e2b.rst, "Building templates").

The changes, each for one reason: their base images (``ubuntu:22.04``, ``e2bdev/base``) are a
template imported in the test (busybox, bash, an ``/etc/passwd``), as sandboxd pulls no image;
their start commands are left out (refused here: a sandbox starts no process of its
template); the message of a refused user is sandboxd's. Each test keeps its upstream name.
Of the 16 tests of that directory that call the API, 15 are here; the one left out is
``test_build_template_from_base_template`` (``from_template("base")``: ``base`` is the host's
root, not a template). The directory's other 59 (``test_stacktrace``, ``test_upload_file``,
``test_bound_api_params``, the mocked half of ``test_tags``, ``test_to_dockerfile``,
``test_from_dockerfile``) mock the API, stub a server of their own or call none: they test
the SDK alone, and are not ported. The async directory mirrors these; the async SDK's build runs in
tests/e2b/test_e2b_template_build.py.
"""

import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from e2b import BuildException, Template, TemplateException, default_build_logger
from e2b.template.main import TemplateClass

from tests.e2b.conftest import E2BDaemon, point_sdk_at
from tests.e2b.test_e2b_template_build import names
from tests.e2b.test_templates import native
from tests.templates.archives import file
from tests.templates.rootfs import rootfs

UBUNTU = "e2b-upstream-ubuntu"
"""What stands for ``ubuntu:22.04`` and ``e2bdev/base``."""
PASSWD = b"root:x:0:0:root:/root:/bin/sh\n"


@pytest.fixture(scope="module")
def upstream(isolated_front: E2BDaemon) -> Iterator[E2BDaemon]:
    base = rootfs("/bin/bash", extra=[file("etc/passwd", PASSWD)])
    assert native(isolated_front, "PUT", f"/templates/{UBUNTU}", base) == 201
    try:
        yield isolated_front
    finally:
        for name in names(isolated_front):
            if name.startswith(("e2b-test-", "e2b-tags-test", UBUNTU)):
                native(isolated_front, "DELETE", f"/templates/{name}")


@pytest.fixture
def build(monkeypatch: pytest.MonkeyPatch, upstream: E2BDaemon) -> Any:
    """Upstream's ``build`` fixture: a build under a random name."""
    point_sdk_at(monkeypatch, upstream)

    def _build(template: TemplateClass, name: str | None = None, **kwargs: Any) -> Any:
        return Template.build(template, name or f"e2b-test-{uuid.uuid4().hex[:12]}", **kwargs)

    return _build


@pytest.fixture(scope="module")
def setup_test_folder() -> Iterator[str]:
    test_dir = tempfile.mkdtemp(prefix="python_sync_test_")
    folder_path = os.path.join(test_dir, "folder")
    os.makedirs(folder_path, exist_ok=True)
    with open(os.path.join(folder_path, "test.txt"), "w") as f:
        f.write("This is a test file.")
    os.symlink("test.txt", os.path.join(folder_path, "symlink.txt"))
    os.symlink(os.path.join(folder_path, "test.txt"), os.path.join(folder_path, "symlink2.txt"))
    os.symlink("12345test.txt", os.path.join(folder_path, "symlink3.txt"))
    yield test_dir
    shutil.rmtree(test_dir, ignore_errors=True)


# test_build.py


def test_build_template(build: Any, setup_test_folder: str) -> None:
    template = (
        Template(file_context_path=setup_test_folder)
        .from_image(UBUNTU)
        .copy("folder/*", "folder", force_upload=True)
        .run_cmd("cat folder/test.txt")
        .set_workdir("/app")
    )
    build(template, skip_cache=True, on_build_logs=default_build_logger())


def test_build_template_with_symlinks(build: Any, setup_test_folder: str) -> None:
    template = (
        Template(file_context_path=setup_test_folder)
        .from_image(UBUNTU)
        .skip_cache()
        .copy("folder/*", "folder", force_upload=True)
        .run_cmd("cat folder/symlink.txt")
    )
    build(template)


def test_build_template_with_resolve_symlinks(build: Any, setup_test_folder: str) -> None:
    template = (
        Template(file_context_path=setup_test_folder)
        .from_image(UBUNTU)
        .skip_cache()
        .copy(
            "folder/symlink.txt",
            "folder/symlink.txt",
            force_upload=True,
            resolve_symlinks=True,
        )
        .run_cmd("cat folder/symlink.txt")
    )
    build(template)


# test_background_build.py


def test_build_in_background_should_start_build_and_return_info(build: Any) -> None:
    template = Template().from_image(UBUNTU).skip_cache().run_cmd("sleep 2")
    name = f"e2b-test:v1-{uuid.uuid4()}"
    build_info = Template.build_in_background(template, name, cpu_count=1, memory_mb=1024)
    assert build_info is not None
    status = Template.get_build_status(build_info)
    assert status.status.value == "building"  # returned before the build's 2 s sleep ended
    while status.status.value == "building":
        time.sleep(0.2)
        status = Template.get_build_status(build_info)
    assert status.status.value == "ready"


# test_exists.py


def test_check_base_template_name_exists(build: Any) -> None:
    assert Template.exists("base") is True


def test_check_non_existing_name(build: Any) -> None:
    assert Template.exists(f"nonexistent-{uuid.uuid4()}") is False


# methods/test_run_cmd.py


def test_run_command(build: Any) -> None:
    build(Template().from_image(UBUNTU).skip_cache().run_cmd("ls -l"))


def test_run_command_as_different_user(build: Any) -> None:
    template = (
        Template().from_image(UBUNTU).skip_cache().run_cmd('test "$(whoami)" = "root"', user="root")
    )
    build(template)


def test_run_command_as_user_that_does_not_exist(build: Any) -> None:
    template = Template().from_image(UBUNTU).skip_cache().run_cmd("whoami", user="root123")
    with pytest.raises(BuildException) as exc_info:
        build(template)
    assert "step 1: user 'root123' is not available" in str(exc_info.value)


# methods/test_make_symlink.py


def test_make_symlink(build: Any) -> None:
    template = (
        Template()
        .from_image(UBUNTU)
        .skip_cache()
        .make_symlink(".bashrc", ".bashrc.local")
        .run_cmd('test "$(readlink .bashrc.local)" = ".bashrc"')
    )
    build(template)


def test_make_symlink_force(build: Any) -> None:
    template = (
        Template()
        .from_image(UBUNTU)
        .make_symlink(".bashrc", ".bashrc.local")
        .skip_cache()
        .make_symlink(".bashrc", ".bashrc.local", force=True)
        .run_cmd('test "$(readlink .bashrc.local)" = ".bashrc"')
    )
    build(template)


# test_tags.py, TestTagsIntegration


def test_build_template_with_tags_assign_and_delete(build: Any) -> None:
    initial_tag = f"e2b-tags-test:v1-{uuid.uuid4().hex}"
    build_info = build(Template().from_image(UBUNTU), name=initial_tag)
    assert build_info.build_id and build_info.template_id
    tag_info = Template.assign_tags(initial_tag, ["production", "latest"])
    assert tag_info.build_id
    assert "production" in tag_info.tags and "latest" in tag_info.tags


def test_assign_single_tag_to_existing_template(build: Any) -> None:
    initial_tag = f"e2b-tags-test:v1-{uuid.uuid4().hex}"
    build(Template().from_image(UBUNTU), name=initial_tag)
    tag_info = Template.assign_tags(initial_tag, "stable")
    assert tag_info.build_id and "stable" in tag_info.tags
    moved = Template.assign_tags(initial_tag, "stable")  # assigned again: moved, as in E2B
    assert moved.tags == ["stable"]


def test_rejects_invalid_tag_format_missing_alias(build: Any) -> None:
    initial_tag = f"e2b-tags-test:v1-{uuid.uuid4().hex}"
    build(Template().from_image(UBUNTU), name=initial_tag)
    with pytest.raises(TemplateException):
        Template.assign_tags(initial_tag, ":invalid-tag")


def test_rejects_invalid_tag_format_missing_tag(build: Any) -> None:
    initial_tag = f"e2b-tags-test:v1-{uuid.uuid4().hex}"
    build(Template().from_image(UBUNTU), name=initial_tag)
    with pytest.raises(TemplateException):
        Template.assign_tags(initial_tag, "e2b-tags-test:")
