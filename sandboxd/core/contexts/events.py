"""What one execution in a context yields, as plain values, in the order the kernel says them."""

from collections.abc import Mapping
from typing import Any

from attrs import frozen


@frozen
class Count:
    """The execution count the kernel gave the cell."""

    execution_count: int


@frozen
class Output:
    """Text the cell wrote: ``stream`` is ``"stdout"`` or ``"stderr"``."""

    stream: str
    text: str


@frozen
class Result:
    """A MIME bundle (``{"text/plain": ..., "image/png": base64...}``); ``is_main_result``:
    the value of the cell's trailing expression, else something it displayed."""

    data: Mapping[str, Any]
    is_main_result: bool


@frozen
class Error:
    """The cell raised (or the kernel died: ``name`` ``KernelDied``), with the traceback's
    lines."""

    name: str
    value: str
    traceback: tuple[str, ...]


@frozen
class End:
    """The execution is over: nothing follows."""


Event = Count | Output | Result | Error | End
