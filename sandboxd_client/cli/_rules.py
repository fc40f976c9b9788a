"""``sandboxctl create``'s header rules (docs/client.rst, "Header rules from sandboxctl"):
``--rule HOST:HEADER=VALUE`` (the value on the command line, hence in the shell's history and
the process list: for values that are not secret), ``--rule-env HOST:HEADER=VARIABLE`` (the
value read from that environment variable) and ``--rules-file FILE`` (a JSON object
``{host: {header: value}}``), merged in that order, a later value winning. No error repeats a
value."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence


def rules_of(
    literal: Sequence[tuple[str, str, str]],
    from_env: Sequence[tuple[str, str, str]],
    rules_file: str | None,
    environ: Mapping[str, str],
) -> dict[str, dict[str, str]]:
    """The header rules the options give, ``{host: {header: value}}``; ``ValueError`` naming
    a missing variable or a file that is not such an object."""
    found: dict[str, dict[str, str]] = {}
    for host, header, value in literal:
        found.setdefault(host, {})[header] = value
    for host, header, variable in from_env:
        if variable not in environ:
            raise ValueError(f"--rule-env {host}:{header}: the environment has no {variable}")
        found.setdefault(host, {})[header] = environ[variable]
    if rules_file is not None:
        with open(rules_file, encoding="utf-8") as f:
            try:
                loaded = json.load(f)
            except ValueError:
                loaded = None
        if not isinstance(loaded, dict) or not all(
            isinstance(headers, dict) and all(isinstance(v, str) for v in headers.values())
            for headers in loaded.values()
        ):
            raise ValueError(
                f"--rules-file {rules_file}: expected a JSON object {{host: {{header: value}}}}"
            )
        for host, headers in loaded.items():
            found.setdefault(host, {}).update(headers)
    return found
