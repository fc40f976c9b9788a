"""
A contract-level fake sandboxd: every route of wire contract v1 (docs/contract.rst, "Routes") on a
real Klein server, with workspaces in a temporary directory and a handful of canned exec commands.

It knows nothing of the client; it exists so the client can be checked against the contract
over real TCP. It records every request (method, path, query, headers, listening port) so tests
can check routing, encoding and the bearer token.

Run standalone (for subprocess tests): ``python client_fakes.py ROOT`` prints the port.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from attrs import define, field
from klein import Klein
from twisted.internet import reactor as global_reactor
from twisted.internet.task import deferLater
from twisted.web.server import Request, Site
from twisted.web.static import File


@define
class Seen:
    """One request as the fake received it."""

    method: str
    path: str
    args: dict[str, list[str]]
    headers: dict[str, str]
    port: int
    body: bytes = b""


def _json(request: Request, code: int, obj: object) -> bytes:
    request.setResponseCode(code)
    request.setHeader("Content-Type", "application/json")
    return json.dumps(obj).encode()


def _error(request: Request, code: int, error: str, detail: str) -> bytes:
    return _json(request, code, {"error": error, "detail": detail})


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class _Refusal(Exception):
    def __init__(self, code: int, error: str, detail: str) -> None:
        self.code, self.error, self.detail = code, error, detail


@define
class FakeSandboxd:
    """In-memory state plus a Klein app; ``pod_url`` is what create answers."""

    root: Path
    token: str | None = None
    pod_url: str = ""
    seen: list[Seen] = field(factory=list)
    ready: set[str] = field(factory=set)
    persisted: list[tuple[str, bool]] = field(factory=list)
    counter: int = 0
    app: Klein = field(factory=Klein)

    def __attrs_post_init__(self) -> None:
        self._routes()

    def site(self) -> Site:
        return Site(self.app.resource())

    # -- helpers -------------------------------------------------------------------------

    def workspace(self, rid: str) -> Path:
        ws = self.root / rid / "workspace"
        if not ws.is_dir():
            raise _Refusal(404, "SandboxNotFound", f"no sandbox {rid}")
        return ws

    def resolve(self, rid: str, path: str | None) -> Path:
        if path is None or "\x00" in path:
            raise _Refusal(400, "BadRequest", "path: missing or NUL")
        parts = [p for p in path.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise _Refusal(400, "BadRequest", "path: escapes the workspace")
        return self.workspace(rid).joinpath(*parts)

    def _record(self, request: Request) -> None:
        self.seen.append(
            Seen(
                method=request.method.decode(),
                path=request.path.decode(),
                args={k.decode(): [v.decode() for v in vs] for k, vs in request.args.items()},
                headers={
                    k.decode().lower(): v[0].decode()
                    for k, v in request.requestHeaders.getAllRawHeaders()
                },
                port=request.getHost().port,
            )
        )

    def _arg(self, request: Request, name: str) -> str | None:
        values = request.args.get(name.encode())
        return values[0].decode() if values else None

    def _body(self, request: Request) -> Any:
        try:
            return json.loads(request.content.read() or b"{}")
        except ValueError:
            raise _Refusal(400, "BadRequest", "body: not JSON") from None

    def _files(self, base: Path) -> Iterator[Path]:
        for dirpath, _dirs, files in os.walk(base):
            for name in sorted(files):
                yield Path(dirpath) / name

    # -- routes --------------------------------------------------------------------------

    def _routes(self) -> None:
        app = self.app

        def guarded(f: Any) -> Any:
            def handler(request: Request, **kw: Any) -> Any:
                self._record(request)
                auth = request.getHeader("authorization")
                open_route = request.path in (b"/healthz", b"/readyz")
                if self.token and not open_route and auth != f"Bearer {self.token}":
                    return _error(request, 401, "Unauthorized", "missing or wrong token")
                try:
                    return f(request, **kw)
                except _Refusal as r:
                    return _error(request, r.code, r.error, r.detail)

            handler.__name__ = f.__name__
            return handler

        @app.route("/healthz", methods=["GET"])
        @guarded
        def healthz(request: Request) -> bytes:
            return _json(
                request, 200, {"status": "ok", "version": "fake-1", "capabilities": ["auth"]}
            )

        @app.route("/sandboxes", methods=["POST"])
        @guarded
        def create(request: Request) -> bytes:
            spec = self._body(request)
            self.seen[-1].body = json.dumps(spec).encode()
            self.counter += 1
            rid = f"sb-{self.counter}"
            (self.root / rid / "workspace").mkdir(parents=True)
            if spec.get("item_id"):
                self.ready.add(rid)
            return _json(request, 200, {"pod_url": self.pod_url, "remote_id": rid})

        @app.route("/sandboxes", methods=["GET"])
        @guarded
        def listing(request: Request) -> bytes:
            rids = sorted(p.name for p in self.root.iterdir() if (p / "workspace").is_dir())
            items = [
                {
                    "remote_id": r,
                    "created": 1.0,
                    "last_active": 2.0,
                    "ready": r in self.ready,
                    "execs": 0,
                }
                for r in rids
            ]
            return _json(request, 200, {"sandboxes": items})

        @app.route("/sandboxes/<rid>", methods=["DELETE"])
        @guarded
        def kill(request: Request, rid: str) -> bytes:
            self.workspace(rid)
            shutil.rmtree(self.root / rid)
            self.ready.discard(rid)
            request.setResponseCode(204)
            return b""

        @app.route("/sandboxes/<rid>/stats", methods=["GET"])
        @guarded
        def stats(request: Request, rid: str) -> bytes:
            self.workspace(rid)
            return _json(
                request,
                200,
                {
                    "memory_bytes": 4096,
                    "memory_peak_bytes": 8192,
                    "cpu_usec": 12,
                    "pids": 1,
                    "oom_kills": 0,
                    "cpus": [1],
                },
            )

        @app.route("/sandboxes/<rid>/persist", methods=["POST"])
        @guarded
        def persist(request: Request, rid: str) -> bytes:
            self.workspace(rid)
            body = self._body(request)
            if not isinstance(body.get("delete"), bool):
                raise _Refusal(400, "BadRequest", "delete: not a boolean")
            self.persisted.append((rid, body["delete"]))
            request.setResponseCode(204)
            return b""

        @app.route("/sandboxes/<rid>/file", methods=["PUT"])
        @guarded
        def put_file(request: Request, rid: str) -> bytes:
            target = self.resolve(rid, self._arg(request, "path"))
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "wb") as f:
                shutil.copyfileobj(request.content, f, 1 << 20)
            request.setResponseCode(204)
            return b""

        @app.route("/sandboxes/<rid>/file", methods=["GET"])
        @guarded
        def get_file(request: Request, rid: str) -> Any:
            target = self.resolve(rid, self._arg(request, "path"))
            if not target.is_file():
                raise _Refusal(404, "FileNotFoundError", f"no file {target.name}")
            return File(str(target), defaultType="application/octet-stream")

        @app.route("/sandboxes/<rid>/file", methods=["DELETE"])
        @guarded
        def delete_file(request: Request, rid: str) -> bytes:
            target = self.resolve(rid, self._arg(request, "path"))
            if not target.is_file():
                raise _Refusal(404, "FileNotFoundError", f"no file {target.name}")
            target.unlink()
            request.setResponseCode(204)
            return b""

        @app.route("/sandboxes/<rid>/exists", methods=["GET"])
        @guarded
        def exists(request: Request, rid: str) -> bytes:
            target = self.resolve(rid, self._arg(request, "path"))
            return _json(request, 200, {"exists": target.exists()})

        @app.route("/sandboxes/<rid>/size", methods=["GET"])
        @guarded
        def size(request: Request, rid: str) -> bytes:
            target = self.resolve(rid, self._arg(request, "path"))
            return _json(
                request, 200, {"size": target.stat().st_size if target.is_file() else None}
            )

        @app.route("/sandboxes/<rid>/disk-usage", methods=["GET"])
        @guarded
        def disk_usage(request: Request, rid: str) -> bytes:
            total = sum(p.stat().st_size for p in self._files(self.workspace(rid)))
            return _json(request, 200, {"bytes": total})

        @app.route("/sandboxes/<rid>/mark-ready", methods=["POST"])
        @guarded
        def mark_ready(request: Request, rid: str) -> bytes:
            self.workspace(rid)
            self.ready.add(rid)
            request.setResponseCode(204)
            return b""

        @app.route("/sandboxes/<rid>/ready", methods=["GET"])
        @guarded
        def ready(request: Request, rid: str) -> bytes:
            self.workspace(rid)
            return _json(request, 200, {"ready": rid in self.ready})

        @app.route("/sandboxes/<rid>/walk", methods=["GET"])
        @guarded
        def walk(request: Request, rid: str) -> bytes:
            base = self.resolve(rid, self._arg(request, "root") or "/")
            ws = self.workspace(rid)
            entries = [
                {
                    "path": str(p.relative_to(ws)),
                    "size": p.stat().st_size,
                    "version": str(p.stat().st_mtime_ns),
                }
                for p in self._files(base)
            ]
            return _json(request, 200, {"entries": entries})

        @app.route("/sandboxes/<rid>/mkdir", methods=["POST"])
        @guarded
        def mkdir(request: Request, rid: str) -> bytes:
            self.resolve(rid, self._body(request).get("path")).mkdir(parents=True, exist_ok=True)
            request.setResponseCode(204)
            return b""

        @app.route("/sandboxes/<rid>/dir", methods=["DELETE"])
        @guarded
        def rmdir(request: Request, rid: str) -> bytes:
            target = self.resolve(rid, self._arg(request, "path"))
            if not target.is_dir():
                raise _Refusal(404, "FileNotFoundError", f"no directory {target.name}")
            shutil.rmtree(target)
            request.setResponseCode(204)
            return b""

        @app.route("/sandboxes/<rid>/rename", methods=["POST"])
        @guarded
        def rename(request: Request, rid: str) -> bytes:
            body = self._body(request)
            src, dst = self.resolve(rid, body.get("src")), self.resolve(rid, body.get("dst"))
            if not src.exists():
                raise _Refusal(404, "FileNotFoundError", f"no file {src.name}")
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dst)
            request.setResponseCode(204)
            return b""

        @app.route("/tools/resolve", methods=["POST"])
        @guarded
        def resolve(request: Request) -> bytes:
            tools, refused = {}, {}
            for name, url in self._body(request).get("tools", {}).items():
                if "bad" in url:
                    refused[name] = "digest mismatch"
                else:
                    tools[name] = {
                        "sha": "ab" * 32,
                        "version": "1.0",
                        "stale": False,
                        "commands": [
                            {"name": name, "description": "d", "parameters": {"type": "object"}}
                        ],
                    }
            return _json(request, 200, {"tools": tools, "refused": refused})

        @app.route("/sandboxes/<rid>/exec", methods=["POST"])
        @guarded
        def exec_(request: Request, rid: str) -> Any:
            self.workspace(rid)
            body = self._body(request)
            self.seen[-1].body = json.dumps(body).encode()
            cmd = body.get("cmd")
            if not isinstance(cmd, list) or not cmd:
                raise _Refusal(400, "BadRequest", "cmd: missing")
            request.setHeader("Content-Type", "application/x-ndjson")
            return self._exec(request, rid, cmd, body)

    async def _exec(self, request: Request, rid: str, cmd: list[str], body: dict[str, Any]) -> None:
        """Canned commands; frames are written one reactor turn apart, like a live stream."""
        out, err, code = b"", b"", 0
        chunks: list[bytes] = []
        name, args = cmd[0], cmd[1:]
        if name == "echo":
            out = (" ".join(args) + "\n").encode()
            chunks = [out]
        elif name == "exit":
            code = int(args[0])
        elif name == "cat":
            out = base64.b64decode(body.get("stdin", ""))
            chunks = [out]
        elif name == "printenv":
            out = (body.get("env", {}).get(args[0], "") + "\n").encode()
            chunks = [out]
        elif name == "pwd":
            out = (body.get("cwd") or "/").encode()
            chunks = [out]
        elif name == "both":
            out, err = b"to stdout\n", b"to stderr\n"
            chunks = [out, err]
            code = 3
        elif name == "spam":
            chunks = [bytes([65 + i % 26]) * int(args[1]) for i in range(int(args[0]))]
            out = b"".join(chunks)
        else:
            err, code = f"{name}: not found\n".encode(), 127
            chunks = [err]
        for chunk in chunks:
            request.write(json.dumps({"o": _b64(chunk)}).encode() + b"\n")
            request.write(b'{"o": ""}\n')
            await deferLater(global_reactor, 0, lambda: None)
        final = {"exit": code, "out": _b64(out), "err": _b64(err)}
        if name == "spam" and len(args) > 2:
            final["truncated"] = True
        request.write(json.dumps(final).encode() + b"\n")


def serve(root: str) -> None:
    fake = FakeSandboxd(Path(root))
    port = global_reactor.listenTCP(0, fake.site(), interface="127.0.0.1")
    fake.pod_url = f"http://127.0.0.1:{port.getHost().port}"
    print(port.getHost().port, flush=True)
    global_reactor.run()


if __name__ == "__main__":
    serve(sys.argv[1])
