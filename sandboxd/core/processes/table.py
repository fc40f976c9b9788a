"""A sandbox's table of background processes: their records, found by id or by pid.

Records stay after their process ends (its exit code and log can still be read) until the
sandbox dies or ``limit`` newer ones push them out, the oldest ended first. A start when
every record is of a running process is refused (:class:`~sandboxd.errors.TooMany`).
"""

import secrets

from sandboxd.core.processes.process import Process
from sandboxd.errors import ProcessNotFound, TooMany


class ProcessTable:
    """The background processes of one sandbox, in the order they started."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._records: dict[str, Process] = {}

    def new_id(self) -> str:
        """An id no record of this table has."""
        while True:
            candidate = secrets.token_hex(6)
            if candidate not in self._records:
                return candidate

    def make_room(self) -> None:
        """Push out the oldest ended records so one more fits; ``TooMany`` when every
        record is of a running process."""
        while len(self._records) >= self.limit:
            oldest = next((p for p in self._records.values() if not p.running), None)
            if oldest is None:
                raise TooMany(f"{self.limit} processes are running in this sandbox already")
            del self._records[oldest.id]

    def add(self, process: Process) -> None:
        self.make_room()
        self._records[process.id] = process

    def get(self, process_id: str) -> Process:
        """The record ``process_id``, else ``ProcessNotFound``."""
        found = self._records.get(process_id)
        if found is None:
            raise ProcessNotFound(f"no process {process_id!r} in this sandbox")
        return found

    def by_pid(self, pid: int) -> Process:
        """The newest record whose pid is ``pid``, else ``ProcessNotFound``."""
        for process in reversed(self._records.values()):
            if process.pid == pid:
                return process
        raise ProcessNotFound(f"no process with pid {pid} in this sandbox")

    def by_tag(self, tag: str) -> Process:
        """The newest record tagged ``tag``, else ``ProcessNotFound``."""
        for process in reversed(self._records.values()):
            if process.tag == tag:
                return process
        raise ProcessNotFound(f"no process tagged {tag!r} in this sandbox")

    def all(self) -> list[Process]:
        return list(self._records.values())

    @property
    def running(self) -> list[Process]:
        return [p for p in self._records.values() if p.running]

    def close(self) -> None:
        """The sandbox dies: every reader is told, every process killed."""
        for process in self._records.values():
            process.close()
