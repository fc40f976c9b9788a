"""What makes and enters a sandbox's pinned namespaces: the exec helper's argv
(:class:`HelperCreator`); the shell chain's is :mod:`sandboxd.isolation.namespaces.shell`."""

from collections.abc import Sequence

from attrs import define

from sandboxd.isolation.namespaces.kinds import KINDS

LETTER = {"ipc": "i", "mount": "m", "net": "n", "pid": "p"}
"""Each layer's letter in the helper's ``KINDS`` argument."""


class Creator:
    """Makes and pins one sandbox's namespaces (the helper's, or the shell chain's argv)."""

    def argv(
        self,
        nsroot: str,
        rid: str,
        kinds: frozenset[str],
        places: tuple[str, str],
        shm: int,
        keep: list[str],
    ) -> list[str]:
        """The argv making ``rid``'s namespaces; ``places`` are its tmp and workspace."""
        raise NotImplementedError

    def enter(self, pins: Sequence[str], argv: list[str]) -> list[str]:
        raise NotImplementedError


@define
class HelperCreator(Creator):
    """``sandboxd-exec namespaces`` at create, ``sandboxd-exec enter`` before each exec."""

    helper: str

    def argv(
        self,
        nsroot: str,
        rid: str,
        kinds: frozenset[str],
        places: tuple[str, str],
        shm: int,
        keep: list[str],
    ) -> list[str]:
        letters = "".join(LETTER[kind] for kind in KINDS if kind in kinds)
        return [self.helper, "namespaces", nsroot, rid, letters, *places, str(shm), *keep]

    def enter(self, pins: Sequence[str], argv: list[str]) -> list[str]:
        """``argv`` is the helper's own (``sandboxd-exec sandbox ...``), run past the pins."""
        return [self.helper, "enter", str(len(pins)), *pins, *argv]
