"""Names in egress policies: patterns, matching, and the name a connection's first bytes ask
for, read from real ClientHellos (made by Python's ``ssl``, as a client in a sandbox would send
them) and HTTP requests."""

import ssl

import pytest

from sandboxd.isolation.network.egress_names import (
    NO_NAME,
    PEEK_MAX,
    matches,
    normal_name,
    parse_pattern,
    peek_name,
)


def client_hello(server_hostname: str | None) -> bytes:
    """The first flight of a TLS client for ``server_hostname`` (``None``: no SNI)."""
    context = ssl.create_default_context()
    context.check_hostname = server_hostname is not None
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = context.wrap_bio(incoming, outgoing, server_hostname=server_hostname)
    with pytest.raises(ssl.SSLWantReadError):
        client.do_handshake()
    return outgoing.read()


def test_patterns_and_matching() -> None:
    assert parse_pattern(" Example.COM. ") == "example.com"
    assert parse_pattern("*.Example.com") == "*.example.com"
    assert parse_pattern("bücher.example") == "xn--bcher-kva.example"
    for bad in ("example", "1.2.3.4", "-a.example.com", "a..b", "*.", "x" * 64 + ".com", "ü" * 70):
        with pytest.raises(ValueError, match="is not a host name"):
            parse_pattern(bad)
    assert matches("example.com", "example.com")
    assert not matches("example.com", "api.example.com")
    assert matches("*.example.com", "api.example.com")
    assert matches("*.example.com", "a.b.example.com")
    assert not matches("*.example.com", "example.com")
    assert not matches("*.example.com", "badexample.com")


def test_the_sni_of_a_real_client_hello() -> None:
    hello = client_hello("API.example.com")
    assert peek_name(hello) == "api.example.com"
    assert peek_name(hello[:3]) is None  # the record header is not complete
    assert peek_name(hello[:40]) is None  # nor the record
    assert peek_name(client_hello(None)) == NO_NAME
    broken = hello[:5] + b"\x01" + b"\xff" * (len(hello) - 6)
    assert peek_name(broken) == NO_NAME
    server_hello = hello[:5] + b"\x02" + hello[6:]
    assert peek_name(server_hello) == NO_NAME
    huge = b"\x16\x03\x01\xff\xff"  # a record over the peek bound never completes
    assert peek_name(huge) == NO_NAME


def test_an_sni_of_another_name_type_is_no_name() -> None:
    hello = bytearray(client_hello("example.com"))
    at = hello.index(b"example.com") - 3  # name_type, then its 2-byte length
    assert hello[at] == 0
    hello[at] = 1
    assert peek_name(bytes(hello)) == NO_NAME


@pytest.mark.parametrize(
    ("request_bytes", "name"),
    [
        (b"GET / HTTP/1.1\r\nHost: Example.com:8080\r\nAccept: */*\r\n\r\n", "example.com"),
        (b"GET / HTTP/1.0\r\nhost: api.example.com\r\n\r\n", "api.example.com"),
        (b"GET / HTTP/1.1\r\nAccept: */*\r\n\r\n", NO_NAME),
        (b"GET / HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n\r\n", NO_NAME),
        (b"GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n", NO_NAME),
        (b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", NO_NAME),
        (b"SSH-2.0-OpenSSH\r\n\r\n", NO_NAME),
        (b"GET / HTTP/1.1\r\nHost: example.com\r\n", None),
        (b"", None),
        (b"A" * PEEK_MAX, NO_NAME),
    ],
)
def test_the_host_of_an_http_request(request_bytes: bytes, name: str | None) -> None:
    assert peek_name(request_bytes) == name
    if name:
        assert normal_name(name) == name
