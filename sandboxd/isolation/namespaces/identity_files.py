"""The ``/etc/passwd`` and ``/etc/group`` a sandbox with a mount namespace sees.

A sandbox's uid is a bare number from the pool, with no entry in the host's files, and
``whoami``, ``id -un``, ``getpwuid``, Node's ``os.userInfo()`` (npm), ``git commit`` and many
installers fail without a name. Each sandbox therefore gets two small files of its own, written
beside its namespace pins (``{root}/.ns/{rid}/``, root-owned, mode 0644) and bound over the
host's in its mount namespace (``sandboxd_exec_ns.h``, the shell chain alike): ``root`` and
``nobody`` as on any system, and :data:`USER_NAME` for the sandbox's own uid and gid, its home
where its commands' ``HOME`` points. Nothing changes on the host. See docs/operating.rst,
``isolation.mount``.
"""

import os
import stat

from attrs import define

from sandboxd.isolation.base import Identity

USER_NAME = "user"
"""The name a sandbox's uid has inside it (E2B's, too)."""

PASSWD = "passwd"
GROUP = "group"
"""The file names beside the pins, and the ones in ``/etc`` they cover."""


def passwd_text(identity: Identity, home: str) -> str:
    """``/etc/passwd`` of a sandbox: root, nobody, and :data:`USER_NAME` as ``identity``."""
    return (
        "root:x:0:0:root:/root:/bin/sh\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
        f"{USER_NAME}:x:{identity.uid}:{identity.gid}:{USER_NAME}:{home}:/bin/sh\n"
    )


def group_text(identity: Identity) -> str:
    """``/etc/group`` of a sandbox: root, nogroup, and :data:`USER_NAME` as its gid."""
    return f"root:x:0:\nnogroup:x:65534:\n{USER_NAME}:x:{identity.gid}:\n"


TRUST_FILE = "ca-certificates.crt"
"""A sandbox's own CA bundle, bound over ``/etc/ssl/certs/ca-certificates.crt`` (written for
every sandbox of the ``egress`` mode, the host's bundle until its policy has a header rule:
docs/isolation.rst, "Header rules over HTTPS"); its name is ``sandboxd_exec_ns.h``'s."""


TEMPLATE_BUNDLE = ("etc", "ssl", "certs", "ca-certificates.crt")
"""Where a template's own CA bundle is, in its files."""

TEMPLATE_BUNDLE_MAX = 4 << 20
"""The largest template bundle read (bytes): a larger one is taken as none (the template's
file is then left unbound, the daemon holding no unbounded read)."""


def template_bundle(rootfs: str) -> bytes:
    """The CA bundle of the template whose files are ``rootfs``, which a sandbox of it
    extends (docs/isolation.rst, "Header rules over HTTPS"): empty when it has none, when a
    part of its path is a link or not what it should be (never followed: a template's link
    names the host's tree here), or when it is larger than :data:`TEMPLATE_BUNDLE_MAX`."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(rootfs, flags | os.O_DIRECTORY)
    except OSError:
        return b""
    try:
        for part in TEMPLATE_BUNDLE:
            last = part == TEMPLATE_BUNDLE[-1]
            opened = os.open(part, flags | (os.O_NONBLOCK if last else os.O_DIRECTORY), dir_fd=fd)
            os.close(fd)
            fd = opened
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b""
        data = os.read(fd, TEMPLATE_BUNDLE_MAX + 1)
    except OSError:
        return b""
    finally:
        os.close(fd)
    return data if len(data) <= TEMPLATE_BUNDLE_MAX else b""


@define
class HostBundle:
    """The host's CA bundle at ``path``, which an egress sandbox's own bundle extends: read
    again only when its file changed (another inode, size or modification time), not at
    every create; empty while there is none."""

    path: str
    _read: tuple[tuple[int, int, int], bytes] | None = None

    def read(self) -> bytes:
        """The bundle's bytes now (empty: no file)."""
        try:
            found = os.stat(self.path)
        except FileNotFoundError:
            return b""
        key = (found.st_ino, found.st_size, found.st_mtime_ns)
        if self._read is None or self._read[0] != key:
            with open(self.path, "rb") as f:
                self._read = (key, f.read())
        return self._read[1]


def write_trust_file(directory: str, bundle: bytes) -> None:
    """Write the sandbox's CA ``bundle`` into ``directory`` (mode 0644, root's)."""
    _write(directory, TRUST_FILE, bundle)


def rewrite_trust_file(directory: str, bundle: bytes) -> bool:
    """Make the sandbox's CA bundle in ``directory`` hold ``bundle``, in place (the same
    inode: the bind over the sandbox's ``/etc/ssl/certs/ca-certificates.crt`` shows it): the
    new bytes written over the old from the start, then the file cut to their length, so a
    reader sees the old bundle, or the old one's start followed by the new one's (the CA
    comes after the host's bundle). Never follows a link, never creates: ``False`` when there
    is no such file (a sandbox without a mount namespace, or whose host has no bundle)."""
    try:
        fd = os.open(
            os.path.join(directory, TRUST_FILE), os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
        )
    except FileNotFoundError:
        return False
    try:
        done = 0
        while done < len(bundle):
            done += os.pwrite(fd, bundle[done:], done)
        os.ftruncate(fd, len(bundle))
    finally:
        os.close(fd)
    return True


def _write(directory: str, name: str, data: bytes) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(os.path.join(directory, name), flags, 0o644)
    try:
        os.fchmod(fd, 0o644)  # whatever the daemon's umask
        os.write(fd, data)
    finally:
        os.close(fd)


def write_identity_files(directory: str, identity: Identity, home: str) -> None:
    """Write the sandbox's ``passwd`` and ``group`` into ``directory`` (mode 0644, owned by
    whoever writes them: root), never following a link there."""
    for name, text in ((PASSWD, passwd_text(identity, home)), (GROUP, group_text(identity))):
        _write(directory, name, text.encode())
