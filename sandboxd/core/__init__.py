"""The core: sandboxes, their commands, files, archive and tools, as plain values and events.

Nothing here sees a request, a status code or a wire frame; the fronts (:mod:`sandboxd.http`,
:mod:`sandboxd.e2b`) parse, call the core, and encode. What they use is exported here, and
only here (``tests/unit/test_unit_core_boundary.py`` checks both directions): the manager
and its entry points, the values it takes and returns (with the isolation's counts the
manager hands on: ``CgroupStats``, ``DiskUsage``), and the file operations a front runs
in a file thread (:mod:`~sandboxd.core.files.workspace`, ``walking``, ``entries``,
``tar_in``, ``tar_out``).
"""

from sandboxd.core.archive.store import RESERVED_PREFIX
from sandboxd.core.contexts import events as context_events
from sandboxd.core.contexts.context import Context
from sandboxd.core.exec import run as _run
from sandboxd.core.exec import spec as _spec
from sandboxd.core.exec.run import ExecRun, Exited, Outcome, SpawnFailed
from sandboxd.core.exec.spec import SHA256_HEX, ExecSpec, parse_env
from sandboxd.core.files import entries, tar_in, tar_out, walking, workspace
from sandboxd.core.files.entries import Entry
from sandboxd.core.files.in_place import Source, write_in_place
from sandboxd.core.files.paths import Parts, normalise
from sandboxd.core.files.tree import UPLOAD_PREFIX
from sandboxd.core.layout import RID_PATTERN
from sandboxd.core.manager import SandboxManager
from sandboxd.core.processes.log import STDERR, Chunk
from sandboxd.core.processes.process import (
    SIGNALS,
    Dropped,
    Ended,
    Process,
    ProcessListing,
    Reader,
    ReaderEvent,
    SandboxGone,
)
from sandboxd.core.processes.terminal import DEFAULT_TERM, TerminalRun, TerminalSize
from sandboxd.core.sandbox import CreateRequest, Sandbox, SandboxListing
from sandboxd.core.templates.build_events import (
    BuildEvent,
    BuildFailed,
    Built,
    StepOutput,
    StepStarted,
)
from sandboxd.core.templates.build_files import read_dockerfile
from sandboxd.core.templates.builder import start_build
from sandboxd.core.templates.recipes import RECIPES
from sandboxd.core.templates.recipes import names as recipe_names
from sandboxd.core.templates.store import Template, TemplateRoot, TemplateStore, check_name
from sandboxd.core.tools.resolver import Resolution, Resolved, ToolResolver
from sandboxd.core.watch.watch import WatchEvent, WorkspaceWatch
from sandboxd.isolation.base import CgroupStats
from sandboxd.isolation.disk.base import DiskUsage

EXEC_CAPABILITIES = (*_spec.CAPABILITIES, *_run.CAPABILITIES)
"""The ``exec`` extensions the core implements (listed by ``/healthz``)."""

__all__ = [
    "DEFAULT_TERM",
    "EXEC_CAPABILITIES",
    "RECIPES",
    "RESERVED_PREFIX",
    "RID_PATTERN",
    "SHA256_HEX",
    "SIGNALS",
    "STDERR",
    "UPLOAD_PREFIX",
    "BuildEvent",
    "BuildFailed",
    "Built",
    "CgroupStats",
    "Chunk",
    "Context",
    "CreateRequest",
    "DiskUsage",
    "Dropped",
    "Ended",
    "Entry",
    "ExecRun",
    "ExecSpec",
    "Exited",
    "Outcome",
    "Parts",
    "Process",
    "ProcessListing",
    "Reader",
    "ReaderEvent",
    "Resolution",
    "Resolved",
    "Sandbox",
    "SandboxGone",
    "SandboxListing",
    "SandboxManager",
    "Source",
    "SpawnFailed",
    "StepOutput",
    "StepStarted",
    "Template",
    "TemplateRoot",
    "TemplateStore",
    "TerminalRun",
    "TerminalSize",
    "ToolResolver",
    "WatchEvent",
    "WorkspaceWatch",
    "check_name",
    "context_events",
    "entries",
    "normalise",
    "parse_env",
    "read_dockerfile",
    "recipe_names",
    "start_build",
    "tar_in",
    "tar_out",
    "walking",
    "workspace",
    "write_in_place",
]
