"""The E2B front's template-build bodies (docs/e2b.rst, "Building templates"): a requested
build, an upload link, a build's status with its log, an alias, tags."""

import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sandboxd.core import Template
    from sandboxd.e2b.template_builds import E2BBuild, LogEntry

LOGS_LIMIT = 100
"""Log entries a status answers at most (the SDK polls on until none are left)."""


def _when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def build_id_of(template: "Template") -> str:
    """The build id a template shows (its tags' ``buildID``): a UUID made of its digest."""
    return str(uuid.UUID(hex=template.digest.partition(":")[2][:32].ljust(32, "0")))


def requested_json(build: "E2BBuild") -> dict[str, Any]:
    """A ``TemplateRequestResponseV3``: the build requested, its template's id, names and
    tags (``default``: a name without one)."""
    names = [build.name, *build.others]
    tags = [name.partition(":")[2] or "default" for name in names]
    return {
        "templateID": build.template_id,
        "buildID": build.id,
        "public": False,
        "names": names,
        "tags": tags,
        "aliases": [build.template_id],
    }


def upload_json(url: str) -> dict[str, Any]:
    """A ``TemplateBuildFileUpload``: never ``present`` (nothing is cached), and its link."""
    return {"present": False, "url": url}


def _entry_json(entry: "LogEntry") -> dict[str, Any]:
    fields: dict[str, Any] = {
        "timestamp": _when(entry.timestamp),
        "level": entry.level,
        "message": entry.message,
    }
    if entry.step is not None:
        fields["step"] = entry.step
    return fields


def _line(entry: "LogEntry") -> str:
    return f"[{_when(entry.timestamp)}] {entry.message}"


def status_json(build: "E2BBuild", offset: int, limit: int) -> dict[str, Any]:
    """A ``TemplateBuildInfo``: the build's status, its log entries from ``offset`` (at most
    ``limit``), and a failed build's reason (its message, step and last entries)."""
    entries = build.log[offset : offset + min(limit, LOGS_LIMIT)]
    fields: dict[str, Any] = {
        "templateID": build.template_id,
        "buildID": build.id,
        "status": build.status,
        "logs": [_line(entry) for entry in entries],
        "logEntries": [_entry_json(entry) for entry in entries],
    }
    if build.reason is not None:
        message, step, last = build.reason
        last_entries = [_entry_json(entry) for entry in last]
        fields["reason"] = {"message": message, "step": step, "logEntries": last_entries}
    return fields


def alias_json(template_id: str) -> dict[str, Any]:
    """A ``TemplateAliasResponse``: the alias is a template of this replica, never public."""
    return {"templateID": template_id, "public": False}


def tags_json(template: "Template", tags: list[str]) -> dict[str, Any]:
    """An ``AssignedTemplateTags``: the tags made, and the build they name."""
    return {"tags": tags, "buildID": build_id_of(template)}


def tag_list_json(templates: list["Template"]) -> list[dict[str, Any]]:
    """``TemplateTag``\\ s: each template of one name with its tag (``default``: none)."""
    return [
        {
            "tag": template.name.partition(":")[2] or "default",
            "buildID": build_id_of(template),
            "createdAt": _when(template.created),
        }
        for template in templates
    ]
