"""An import's own copy of its request's body (``sandboxd/http/routes/templates.py``,
docs/extensions.rst, "Templates"), whichever file twisted.web gave the body: in memory (a
small one), the daemon's spool (an unnamed file of the state root), or, on a state root that
takes no unnamed files (``O_TMPFILE``: the VM's, for one), twisted.web's temporary file. The
copy reads the whole body from its start and outlives the request's own file."""

import io
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

import pytest

from sandboxd.http.routes.templates import own_copy
from sandboxd.web.spool import Spool

BODY = b"a template's archive\n" * 1000


@pytest.mark.parametrize(
    "make",
    [
        lambda _: io.BytesIO(),
        lambda directory: Spool(str(directory)),
        lambda _: tempfile.TemporaryFile(),  # noqa: SIM115 (the request owns and closes it)
    ],
    ids=["memory", "spool", "temporary-file"],
)
def test_an_imports_copy_of_its_body_outlives_the_request(
    tmp_path: Path, make: Callable[[Path], IO[bytes]]
) -> None:
    content = make(tmp_path)
    content.write(BODY)  # the request's file, read to its end by now
    copy = own_copy(content)
    content.close()  # its client went
    try:
        assert copy.read() == BODY
    finally:
        copy.close()
