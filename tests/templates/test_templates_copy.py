"""``COPY`` through the links of the template being built (docs/extensions.rst, "Building a
template"): a link of the tree resolves inside the tree, as it would for a process whose root
the tree is (Debian's ``/bin`` → ``usr/bin``), and never leads out of it, wherever it points
(``/etc``, ``../../..``). Real files, in the test's process."""

import os
import secrets
import tarfile
from pathlib import Path

import pytest

from sandboxd.core.templates.build_events import BuildFailed, Built
from sandboxd.core.templates.store import TemplateStore
from tests.templates.archives import directory, link, tar
from tests.templates.test_templates_builder import context, run
from tests.templates.test_templates_store import put, store_at


@pytest.fixture
def store(tmp_path: Path) -> TemplateStore:
    """A store whose ``debianish`` template has Debian's merged ``/usr`` links, and links that
    point out of its tree: ``evil`` at the host's ``/etc``, ``up`` at ``../../..`` (on the
    host: the state root, outside the template's directory)."""
    templates = store_at(tmp_path)
    tree = [
        directory("usr"),
        directory("usr/bin"),
        directory("usr/lib"),
        directory("etc"),
        link("bin", "usr/bin"),
        link("lib", "/usr/lib"),
        link("sbin", "/nowhere/bin"),
        link("evil", "/etc"),
        link("up", "../../.."),
        link("far", "../../../../../../../../../../etc"),
        link("loop", "loop"),
        link("usr/bin/sh", "busybox"),
    ]
    put(templates, "debianish", tar(tree))
    return templates


def folder(name: str) -> tarfile.TarInfo:
    return directory(name)[0]


def built_root(tmp_path: Path) -> Path:
    return tmp_path / ".templates" / "new" / "rootfs"


def test_a_copy_under_a_linked_directory_lands_where_the_link_resolves_in_the_root(
    store: TemplateStore, tmp_path: Path
) -> None:
    text = (
        "FROM debianish\n"
        "COPY tool /bin/tool\n"
        "COPY libs/ /lib/\n"
        "COPY overlay/ /\n"
        "COPY script /bin/sh\n"
    )
    files = context(
        ("tool", b"tool"),
        folder("libs"),
        ("libs/libx.so", b"lib"),
        ("libs/sub/liby.so", b"sub"),
        folder("overlay"),
        folder("overlay/bin"),
        folder("overlay/usr"),
        folder("overlay/sbin"),
        ("overlay/bin/more", b"more"),
        ("overlay/lib/sub/libz.so", b"z"),
        ("script", b"#!"),
    )
    template, frames = run(store, text, files)
    assert frames[-1] == Built(template), frames
    root = built_root(tmp_path)
    assert (root / "usr/bin/tool").read_bytes() == b"tool"
    assert (root / "usr/lib/libx.so").read_bytes() == b"lib"
    assert (root / "usr/lib/sub/liby.so").read_bytes() == b"sub"
    assert (root / "usr/bin/more").read_bytes() == b"more"
    assert (root / "usr/lib/sub/libz.so").read_bytes() == b"z"
    assert (os.readlink(root / "bin"), os.readlink(root / "lib")) == ("usr/bin", "/usr/lib")
    assert (root / "sbin").is_dir() and not (root / "sbin").is_symlink()  # was a link to nothing
    assert oct((root / "usr/lib/sub").stat().st_mode & 0o777) == oct(0o755)
    # a file's own name is not followed: the link there is replaced, not its target written
    assert not (root / "usr/bin/sh").is_symlink() and (root / "usr/bin/sh").read_bytes() == b"#!"
    assert not (root / "usr/bin/busybox").exists()


def test_links_out_of_the_root_resolve_inside_it_and_nothing_is_written_outside(
    store: TemplateStore, tmp_path: Path
) -> None:
    name = f"sandboxd-test-{secrets.token_hex(6)}"
    text = f"FROM debianish\nCOPY x /evil/{name}\nCOPY x /up/{name}\nCOPY x /far/{name}.far\n"
    template, frames = run(store, text, context(("x", b"inside")))
    assert frames[-1] == Built(template), frames
    root = built_root(tmp_path)
    assert (root / "etc" / name).read_bytes() == b"inside"  # /etc of the tree, not the host's
    assert (root / name).read_bytes() == b"inside"  # ../../.. stopped at the tree's top
    assert (root / "etc" / f"{name}.far").read_bytes() == b"inside"
    assert not os.path.lexists(f"/etc/{name}") and not os.path.lexists(f"/etc/{name}.far")
    assert not (tmp_path / name).exists() and not (tmp_path / ".templates" / name).exists()
    assert os.readlink(root / "evil") == "/etc" and os.readlink(root / "up") == "../../.."


@pytest.mark.parametrize(
    ("dest", "error"),
    [
        ("/sbin/x", "member 'sbin/x': No such file or directory"),  # a link to nothing
        ("/loop/x", "member 'loop/x': its path goes through a link or a file"),
        ("/bin/tool/x", "member 'bin/tool/x': its path goes through a link or a file"),
    ],
)
def test_a_copy_through_a_link_to_nothing_or_a_file_fails_and_leaves_nothing(
    store: TemplateStore, tmp_path: Path, dest: str, error: str
) -> None:
    text = f"FROM debianish\nCOPY x /usr/bin/tool\nCOPY x {dest}\n"
    template, frames = run(store, text, context(("x", b"x")))
    end = frames[-1]
    assert template is None and isinstance(end, BuildFailed), frames
    assert (end.step, end.error) == (3, error)
    assert sorted(os.listdir(tmp_path / ".templates")) == ["debianish"]
