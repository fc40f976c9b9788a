"""``sandboxctl create``'s own SOCKS5 proxy (docs/client.rst, "A SOCKS5 proxy from
sandboxctl"): ``--socks5 ADDRESS:PORT``, ``--socks5-user NAME`` and the password never on the
command line (where the shell's history and the process list would keep it), read from
``--socks5-password-env VARIABLE`` or from the first line of ``--socks5-password-file FILE``,
as ``--rule-env`` and ``--rules-file`` read header values. No error repeats the password.
``--socks5-tls`` turns TLS to the proxy on; ``--socks5-tls-server-name NAME`` (the name its
certificate is verified for) and ``--socks5-ca-file FILE`` (PEM certificates it must chain to)
imply it."""

from __future__ import annotations

from collections.abc import Mapping

from .._socks5 import Socks5, Socks5TLS


def socks5_of(
    address: str | None,
    username: str | None,
    password_env: str | None,
    password_file: str | None,
    tls: bool,
    environ: Mapping[str, str],
    server_name: str | None = None,
    ca_file: str | None = None,
) -> Socks5 | None:
    """The proxy the options give (``None``: no ``--socks5``); ``ValueError`` naming an
    option given without ``--socks5``, a missing variable, an empty file or a CA file that
    cannot be read or holds no PEM certificate."""
    if address is None:
        if username is not None or password_env or password_file or tls or server_name or ca_file:
            raise ValueError("--socks5-user, --socks5-password-* and --socks5-tls* need --socks5")
        return None
    password = None
    if password_env is not None:
        if password_env not in environ:
            raise ValueError(f"--socks5-password-env: the environment has no {password_env}")
        password = environ[password_env]
    elif password_file is not None:
        with open(password_file, encoding="utf-8") as f:
            password = f.readline().rstrip("\r\n")
        if not password:
            raise ValueError(f"--socks5-password-file {password_file}: its first line is empty")
    if server_name is None and ca_file is None:
        return Socks5(address, username, password, tls)
    return Socks5(address, username, password, Socks5TLS(server_name, ca_of(ca_file)))


def ca_of(ca_file: str | None) -> str | None:
    """The PEM of ``--socks5-ca-file`` (``None``: none given); ``ValueError`` naming the file
    when it cannot be read or holds no certificate (the host checks the rest)."""
    if ca_file is None:
        return None
    try:
        with open(ca_file, encoding="utf-8") as f:
            pem = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--socks5-ca-file {ca_file}: cannot read it ({e})") from None
    if "-----BEGIN CERTIFICATE-----" not in pem:
        raise ValueError(f"--socks5-ca-file {ca_file}: holds no PEM certificate")
    return pem
