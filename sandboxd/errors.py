"""The errors the core raises: what went wrong, in words; never how a front answers it.

Each front maps them to its own answer in one place (the HTTP front: the error-type table of
:mod:`sandboxd.http.wire`, which gives the status and the wire ``error`` type).
"""


class SandboxdError(Exception):
    """A failure the caller is told about; the message is its :attr:`detail`. Any other
    subclass than those below is an internal error."""

    @property
    def detail(self) -> str:
        """The message (the class's name when there is none)."""
        return str(self.args[0]) if self.args else type(self).__name__


class BadRequest(SandboxdError):
    """Malformed body, wrong field type, path escaping the workspace, bad item_id."""


class SandboxNotFound(SandboxdError):
    """Unknown or killed sandbox id."""


class PathNotFound(SandboxdError):
    """Download / delete / rmdir / rename of a path that does not exist."""


class InsufficientStorage(SandboxdError):
    """A write failed with ENOSPC or EDQUOT."""


class Draining(SandboxdError):
    """The daemon is draining and refuses new sandboxes."""


class NoCapacity(SandboxdError):
    """No uid (or memory) is left for a new sandbox, or its network mode cannot be given now."""


class ArchiveFailed(SandboxdError):
    """A persist or restore failed; the archive is as it was before the call."""


class ProcessNotFound(SandboxdError):
    """Unknown process id (or one pushed out of the sandbox's table)."""


class ProcessConflict(SandboxdError):
    """The process cannot do that now: stdin without a pipe or after EOF, or it has ended."""


class TooMany(SandboxdError):
    """A per-sandbox bound is reached: every process record is running, or every watch is
    taken."""


class TooManyEntries(SandboxdError):
    """An answer would list more entries than the configured limit (a walk past
    ``SANDBOXD_WALK_MAX``); the message names the limit."""


class TemplateNotFound(SandboxdError):
    """Unknown template name (the message names it)."""


class TemplateConflict(SandboxdError):
    """The template cannot be changed now: its name is taken, or sandboxes use it."""


class BadArchive(BadRequest):
    """An archive that cannot become a template; the message names the member and why."""


class TemplateTooLarge(SandboxdError):
    """An archive whose files pass ``SANDBOXD_TEMPLATE_MAX``; the message names the member."""


class TemplatesUnavailable(SandboxdError):
    """The replica has no template store (its state root could not hold one)."""


class TemplateCannotRun(SandboxdError):
    """A create names a template, and sandboxes cannot run in templates on this replica yet."""


class ContextNotFound(SandboxdError):
    """Unknown interpreter context id (docs/extensions.rst, "Contexts")."""


class ContextsUnavailable(SandboxdError):
    """Contexts cannot run on this host; the message names what is missing."""


class TerminalsUnavailable(SandboxdError):
    """The privilege-drop chain in force cannot give a command a terminal (docs/extensions.rst,
    "Terminals": they need the exec helper)."""
