"""The namespace kinds, or layers (docs/isolation.rst, "Namespaces"): their names, the setting that
chooses them (``SANDBOXD_NAMESPACES``), and the name of each one's pin file."""

KINDS = ("ipc", "mount", "net", "pid")
"""The namespace layers, by the name ``SANDBOXD_NAMESPACES`` and ``/healthz`` use."""

ALL = KINDS
"""The layers ``all`` names: every one; ``pid`` only where the chain can make it (the exec
helper's), left out with a logged reason elsewhere (:class:`AllLayers`)."""


class AllLayers(frozenset[str]):
    """The layers of ``SANDBOXD_NAMESPACES=all``: every layer the chain can make, where a layer
    asked for by name that the chain cannot make stops start-up."""

    setting_text = "all"
    """How the start-up log writes it (read back as it was meant, not as named layers)."""


PIN = {"ipc": "ipc", "mount": "mnt", "net": "net", "pid": "pid"}
"""Each layer's pin file name (as in ``/proc/PID/ns``)."""

HOST_VIEW_PIN = "mnt-host"
"""A templated sandbox's second mount namespace pin: the view it had before its root was
switched (``sandboxd_exec_root.h``), where the daemon's own work as the sandbox runs."""


def parse_namespaces(text: str) -> frozenset[str]:
    """``SANDBOXD_NAMESPACES``: ``all``, ``none``, or layer names separated by commas
    (``pid`` only with ``mount``: its ``/proc`` is mounted there)."""
    value = text.strip().lower()
    if value == "all":
        return AllLayers(ALL)
    if value == "none":
        return frozenset()
    names = {part.strip() for part in value.split(",") if part.strip()}
    if not names:
        raise ValueError("is empty (all, none, or some of ipc, mount, net, pid)")
    for name in names:
        if name not in KINDS:
            raise ValueError(f"{name!r} is not one of all, none, {', '.join(KINDS)}")
    if "pid" in names and "mount" not in names:
        raise ValueError("pid needs mount (the PID namespace's /proc is mounted there)")
    return frozenset(names)
