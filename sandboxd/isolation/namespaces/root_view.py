"""The root a sandbox made from a template sees (docs/isolation.rst, "A sandbox from a
template").

The template's files stay read-only underneath; the sandbox's changes go to an overlay's
upper directory inside its own top directory (``{root}/{rid}/root/``, root's alone, mode
0700), so its disk limit counts them and its end removes them with the rest of its tree. The
overlay is mounted by the holder of the sandbox's new mount namespace and only there, and the
namespace's root is switched onto it once, when the namespaces are pinned
(``sandboxd_exec_root.h``): every later process enters a namespace whose root is already the
template's, and nothing is mounted on the host (a daemon killed in the middle leaves pins and
directories, which start-up removes as any sandbox's).

What the helper needs is written beside the pins as ``root`` (the overlay's mount data, its
mount point, the host directories bound back at their own path) and ``hosts``.
"""

import os
import shutil
from collections.abc import Callable

from attrs import frozen
from twisted.logger import Logger

log = Logger()

ROOT_DIR = "root"
"""The sandbox's root directories, in its top directory."""
ROOT_FILE = "root"
HOSTS_FILE = "hosts"
"""The file names beside the pins (``sandboxd_exec_root.h`` reads them)."""

HOSTS_TEXT = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
"""A templated sandbox's ``/etc/hosts``: its loopback, whatever its network mode."""

UNSAFE = frozenset("\n")
"""Characters the ``root`` file cannot carry in a path (one path a line)."""


def overlay_escaped(path: str) -> str:
    """``path`` as the overlay's mount options carry it: the options' separators (``,``
    between options, ``:`` between lower directories) and the escape itself each behind a
    ``\\``, which the kernel's overlayfs takes away again (a template named ``name:tag``
    lives in such a directory)."""
    return path.replace("\\", "\\\\").replace(",", "\\,").replace(":", "\\:")


@frozen
class RootView:
    """A template's files (``lower``) as the root of the sandbox whose top directory is
    ``top``."""

    lower: str
    top: str

    @property
    def upper(self) -> str:
        return os.path.join(self.top, ROOT_DIR, "upper")

    @property
    def work(self) -> str:
        return os.path.join(self.top, ROOT_DIR, "work")

    @property
    def merged(self) -> str:
        return os.path.join(self.top, ROOT_DIR, "merged")

    def prepare(self) -> None:
        """Make the upper, work and mount-point directories (root's): the upper directory's
        mode is the new root's, 0755. ``OSError`` (``EINVAL``) for a path the ``root`` file
        cannot carry. Where they are made already (a fork's, filled before its
        namespaces are made), nothing is done."""
        if os.path.isdir(self.merged):
            return
        for path in (self.lower, self.upper, self.work):
            if UNSAFE & set(path):
                raise OSError(22, "a path the overlay cannot name (a newline)", path)
        os.mkdir(os.path.join(self.top, ROOT_DIR), 0o700)
        os.mkdir(self.upper, 0o755)
        os.chmod(self.upper, 0o755)  # whatever the daemon's umask
        os.mkdir(self.work, 0o700)
        os.mkdir(self.merged, 0o755)

    def spec(self) -> str:
        """The ``root`` file: mount data, mount point, then the sandbox's top directory, bound
        back at its own path (its commands' working directory, ``HOME`` and ``TMPDIR`` name
        host paths there)."""
        lower, upper, work = map(overlay_escaped, (self.lower, self.upper, self.work))
        data = f"lowerdir={lower},upperdir={upper},workdir={work}"
        return f"{data}\n{self.merged}\n{self.top}\n"


def write_root_files(directory: str, view: RootView) -> None:
    """Write ``root`` and ``hosts`` into the pins' ``directory`` (mode 0644, root's), never
    following a link there."""
    for name, text in ((ROOT_FILE, view.spec()), (HOSTS_FILE, HOSTS_TEXT)):
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(os.path.join(directory, name), flags, 0o644)
        try:
            os.fchmod(fd, 0o644)
            os.write(fd, text.encode())
        finally:
            os.close(fd)


def probe_root(
    nsroot: str, probe_tmp: str, make: Callable[[RootView], None], remove: Callable[[], None]
) -> bool:
    """Whether a template's root can be switched to on this state root (an overlay over its
    filesystem: not over another overlay, say): the start-up probe's namespaces made again
    (``make``) with an empty template, then removed (``remove``). Where not, sandboxes still
    run on the host's root and a create in a template is refused (no ``templates.run``)."""
    top = os.path.join(nsroot, "probe-root")
    shutil.rmtree(top, ignore_errors=True)
    os.mkdir(top, 0o700)
    os.mkdir(os.path.join(top, "lower"), 0o755)
    os.mkdir(probe_tmp, 0o700)
    try:
        view = RootView(os.path.join(top, "lower"), top)
        view.prepare()
        make(view)
        return True
    except OSError as e:
        log.warn("templates: no sandbox can run in a template here: {why}", why=e)
        return False
    finally:
        remove()
        # Where the state root lies in /tmp (test set-ups), the helper made the way to the
        # probe's own directory inside its tmp: gone with it.
        shutil.rmtree(probe_tmp, ignore_errors=True)
        shutil.rmtree(top, ignore_errors=True)
