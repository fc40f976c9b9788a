"""Header rules of an egress policy: per host, HTTP headers the egress proxy sets on each
request on the way out, so that a secret (an ``Authorization``) never enters the sandbox
(docs/isolation.rst, "Header rules").

A request says ``"rules": {"api.example.com": [{"headers": {"Authorization": "Bearer x"}}]}``:
each host (an exact name or ``*.`` and a name, as the lists take them) maps to a list of rule
objects whose ``headers`` are merged in order (a later value wins); a host whose rules set no
header has none. The rule a connection
gets is its name's exact one, else the longest wildcard that matches it (E2B's precedence).

Values are secrets: :class:`HeaderRule` never shows them (its ``repr`` names the headers
alone), the API's listings show the header names alone (:func:`rules_json`), and nothing here
logs them. Header names and values are checked so that a rule can never split a request
(no CR, LF or NUL), nor change how it is framed or where it goes (``Host``,
``Content-Length``, ``Transfer-Encoding`` and the hop-by-hop headers are refused).
"""

import re
from typing import Any

from attrs import field, frozen

from sandboxd.isolation.network.egress_names import matches, parse_pattern

RULES_MAX = 64
"""The most hosts with rules in one policy."""

HEADERS_MAX = 16
"""The most headers one host's rules set."""

VALUE_MAX = 8192
"""The longest header value (bytes)."""

TOTAL_MAX = 65536
"""The most bytes of names and values of one policy's rules together."""

FORBIDDEN = frozenset(
    (
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
        "expect",
    )
)
"""Headers a rule may not set: they say where a request goes or how it is framed."""

_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}$")
_VALUE = re.compile(r"^[\t\x20-\x7e\x80-\xff]*$")


def _names_only(headers: tuple[tuple[str, str], ...]) -> str:
    return repr([name for name, _ in headers])


@frozen
class HeaderRule:
    """The headers set on requests to the hosts ``pattern`` names."""

    pattern: str
    headers: tuple[tuple[str, str], ...] = field(repr=_names_only)
    """(name, value) pairs, one per name (case-insensitively), in the order given."""

    @property
    def names(self) -> list[str]:
        """The header names the rule sets (what listings show)."""
        return [name for name, _ in self.headers]


def parse_rules(value: object, where: str = "rules") -> tuple[HeaderRule, ...]:
    """A request's ``rules`` object (see the module docstring); ``ValueError`` naming the
    host and header of the first thing wrong."""
    if not isinstance(value, dict):
        raise ValueError(f"{where}: must be an object mapping host names to lists of rules")
    if len(value) > RULES_MAX:
        raise ValueError(f"{where}: {len(value)} hosts, at most {RULES_MAX}")
    found: dict[str, HeaderRule] = {}
    total = 0
    for host, entries in value.items():
        try:
            pattern = parse_pattern(host)
        except ValueError:
            raise ValueError(
                f"{where}: {host!r} is not a host name (a name is example.com or *.example.com)"
            ) from None
        headers = _merged(f"{where}.{host}", entries)
        total += sum(len(n) + len(v) for n, v in headers)
        if headers:  # (a rule that sets nothing changes nothing: none is kept)
            found[pattern] = HeaderRule(pattern, headers)
    if total > TOTAL_MAX:
        raise ValueError(f"{where}: {total} bytes of headers, at most {TOTAL_MAX}")
    return tuple(found.values())


def _merged(where: str, entries: object) -> tuple[tuple[str, str], ...]:
    if not isinstance(entries, list):
        raise ValueError(f"{where}: must be a list of rules")
    merged: dict[str, tuple[str, str]] = {}
    for entry in entries:
        if not isinstance(entry, dict) or set(entry) - {"headers"}:
            raise ValueError(f'{where}: a rule is {{"headers": {{NAME: VALUE}}}}')
        headers = entry.get("headers")
        headers = {} if headers is None else headers
        if not isinstance(headers, dict):
            raise ValueError(f"{where}: headers must be an object of names and values")
        for name, text in headers.items():
            merged[name.lower()] = (name, _checked(where, name, text))
    if len(merged) > HEADERS_MAX:
        raise ValueError(f"{where}: {len(merged)} headers, at most {HEADERS_MAX}")
    return tuple(merged.values())


def _checked(where: str, name: str, text: object) -> str:
    """``text``, a valid value for the header ``name`` (never shown in the error)."""
    if not _TOKEN.match(name):
        raise ValueError(f"{where}: {name!r} is not a header name")
    if name.lower() in FORBIDDEN:
        raise ValueError(f"{where}: {name} cannot be set by a rule")
    if not isinstance(text, str) or not _VALUE.match(text) or len(text) > VALUE_MAX:
        raise ValueError(
            f"{where}: the value of {name} must be a string of at most {VALUE_MAX}"
            " characters, without CR, LF, NUL or other control characters"
        )
    return text


def rule_for(rules: tuple[HeaderRule, ...], name: str) -> HeaderRule | None:
    """The rule for the host ``name``: its exact one, else the longest matching wildcard."""
    exact = [rule for rule in rules if rule.pattern == name]
    if exact:
        return exact[0]
    wild = [rule for rule in rules if rule.pattern.startswith("*.") and matches(rule.pattern, name)]
    return max(wild, key=lambda rule: len(rule.pattern), default=None)


def rules_json(rules: tuple[HeaderRule, ...]) -> dict[str, Any]:
    """The rules as listings show them: each host's header names, never a value."""
    return {rule.pattern: rule.names for rule in rules}
