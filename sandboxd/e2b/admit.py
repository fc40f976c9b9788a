"""The E2B front's authorisation, in one object (:class:`Authoriser`), asked twice: by its rule
at the headers (docs/operating.rst, "Connections"), what a request's headers earn it before one
byte of its body is read; and by its routes, which find the sandbox a call is for.

The control plane and every route that is not envd's need ``X-API-Key`` = the daemon's token
(any key when it has none), but a template build's upload, whose link carries its build's
token (:mod:`sandboxd.e2b.templates`). envd's routes need the access token of the sandbox that
``E2b-Sandbox-Id`` names; a ``/files`` URL signed instead (:mod:`sandboxd.e2b.signing`) needs
the signature of a sandbox this front holds (the route judges its operation and expiration).
A request naming a sandbox this front does not hold is answered at once with what the route
answers for it (:func:`refusal`), so that neither a missing key nor a made-up sandbox id
gets a byte of a body stored. Keys and signatures are compared in constant time.

The body of an admitted request to one of envd's routes is spooled in its sandbox's place, under
that sandbox's disk limits (:func:`spool_places`).
"""

import hmac
from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl

from attrs import frozen
from twisted.web.http_headers import Headers
from twisted.web.iweb import IRequest

from sandboxd.e2b import interpreter, signing, wire
from sandboxd.e2b.registry import E2BSandbox, Registry
from sandboxd.e2b.wire import RestError
from sandboxd.web.guard import Admission, Admit
from sandboxd.web.spool import SpoolPlace, SpoolPlaces

if TYPE_CHECKING:
    from sandboxd.e2b.ports import PortAccess

ENVD_ROUTES = (b"/health", b"/files", b"/process.Process/", b"/filesystem.Filesystem/")
"""The paths envd serves (the rest is the control plane, or unsupported)."""


def _header(headers: Headers, name: bytes) -> bytes | None:
    values = headers.getRawHeaders(name)
    return values[0] if values else None


def _sandbox_id(headers: Headers) -> str:
    return (_header(headers, b"e2b-sandbox-id") or b"").decode("utf-8", "replace")


def sandbox_id_of(request: IRequest) -> str:
    """The sandbox a request names (``E2b-Sandbox-Id``; ``""``: none), as its route reads it."""
    return (request.getHeader(b"e2b-sandbox-id") or b"").decode("utf-8", "replace")


def _signed_files_query(path: bytes) -> dict[str, str] | None:
    """The query of a signed ``/files`` URL (``None``: another route, or not signed)."""
    route, _, raw = path.partition(b"?")
    if route != b"/files":
        return None
    text = raw.decode("utf-8", "replace")
    query = dict(parse_qsl(text, keep_blank_values=True))
    return query if signing.is_signed(query) else None


@frozen
class Authoriser:
    """Every check of the E2B front's keys, access tokens and signatures: the API key
    ``token`` of the control plane (``None``: any key), and the sandboxes ``registry`` holds,
    each with its access token.

    :meth:`admit` is the site's rule at the headers; the routes ask :meth:`control_plane`,
    :meth:`envd` and :meth:`files` (through the decorators of :mod:`sandboxd.e2b.api`), the
    same questions with the sandbox found, its operation and its expiration judged too."""

    token: bytes | None
    registry: Registry
    ports: "PortAccess | None" = None
    """Who may reach the sandboxes' ports by host (``None``: no port hosts)."""
    uploads: Callable[[bytes], Admission | None] | None = None
    """What a template build's upload earns by its link (``None`` for another path:
    :func:`sandboxd.e2b.templates.upload_admission`)."""

    def key_valid(self, key: bytes | None) -> bool:
        """Whether ``key`` (an ``X-API-Key``) is the daemon's token (any, without one)."""
        return self.token is None or (key is not None and hmac.compare_digest(key, self.token))

    # At the headers

    def admit(self, path: bytes, authorization: bytes | None, headers: Headers) -> Admission:
        """What a request's headers earn it (see the module's doc; a port host's:
        :meth:`sandboxd.e2b.ports.PortAccess.admit`)."""
        if self.ports is not None:
            verdict = self.ports.admit(headers)
            if verdict is not None:
                return verdict
        if self.uploads is not None:
            verdict = self.uploads(path)
            if verdict is not None:
                return verdict
        route = path.split(b"?", 1)[0]
        port = _header(headers, b"e2b-sandbox-port")
        if interpreter.is_interpreter_call(route, port):
            sandbox_id = _sandbox_id(headers)
            found = self.registry.named_or_all(sandbox_id) if sandbox_id else []
            if not found:
                return Admission.ABSENT
            tokens = interpreter.tokens_of(lambda name: _header(headers, name))
            opened = self.registry.opens_interpreter(found[0], *tokens)
            return Admission.TRUSTED if opened else Admission.REFUSED
        if not route.startswith(ENVD_ROUTES):
            key = _header(headers, b"x-api-key")
            return Admission.TRUSTED if self.key_valid(key) else Admission.REFUSED
        access_header = _header(headers, b"x-access-token")
        sandbox_id = _sandbox_id(headers)
        query = _signed_files_query(path) if access_header is None else None
        if query is not None:
            if sandbox_id and not self.registry.named_or_all(sandbox_id):
                return Admission.ABSENT
            try:
                signed = signing.signs_any(self.registry, sandbox_id, query)
            except RestError:
                signed = False  # a malformed expiration: answered by refusal()
            return Admission.OPEN if signed else Admission.REFUSED
        access = (access_header or b"").decode("utf-8", "replace")
        held = self.registry.holds(sandbox_id, access)
        if held is None:
            return Admission.ABSENT
        return Admission.TRUSTED if held else Admission.REFUSED

    def refusal(self, path: bytes, verdict: Admission, headers: Headers) -> bytes:
        """The whole answer to a request :meth:`admit` refused or found absent (see
        :func:`refusal`; a port host's: :meth:`sandboxd.e2b.ports.PortAccess.refusal`)."""
        if self.ports is not None:
            answer = self.ports.refusal(verdict, headers)
            if answer is not None:
                return answer
        return refusal(path, verdict, headers)

    # In the routes

    def control_plane(self, request: IRequest) -> None:
        """The control plane's key is the daemon's token (any key when it has none)."""
        if not self.key_valid(request.getHeader(b"x-api-key")):
            raise RestError(401, "Invalid API key: X-API-Key must be the daemon's token")

    def envd(self, request: IRequest) -> E2BSandbox:
        """The sandbox an envd call is for, checked against its access token."""
        sandbox_id = sandbox_id_of(request)
        if not sandbox_id:
            raise wire.no_sandbox_named()
        token = (request.getHeader(b"x-access-token") or b"").decode("utf-8", "replace")
        return self.registry.authorised(sandbox_id, token)

    def files(self, request: IRequest, operation: str) -> E2BSandbox:
        """The sandbox a ``/files`` call to ``operation`` (:data:`~sandboxd.e2b.signing.READ`
        or :data:`~sandboxd.e2b.signing.WRITE`) is for: by its access token, else (no token)
        by the URL's signature (:mod:`sandboxd.e2b.signing`), on the registry's clock."""
        args = request.args or {}
        query = {
            k.decode("utf-8", "replace"): v[0].decode("utf-8", "replace")
            for k, v in args.items()
            if v
        }
        if request.getHeader(b"x-access-token") is None and signing.is_signed(query):
            now = self.registry.clock.seconds()
            sandbox_id = sandbox_id_of(request)
            return signing.signed_sandbox(self.registry, sandbox_id, query, operation, now)
        return self.envd(request)


def admission(token: bytes | None, registry: Registry) -> Admit:
    """The rule of a front whose API key is ``token`` and whose sandboxes ``registry`` holds
    (:meth:`Authoriser.admit`)."""
    return Authoriser(token, registry).admit


def refusal(path: bytes, verdict: Admission, headers: Headers) -> bytes:
    """The whole answer to a request refused at its headers (``401``), or naming a sandbox
    this front does not hold (what the route answers for it, see
    :func:`sandboxd.e2b.wire.absent_answer`)."""
    if verdict is Admission.ABSENT:
        return wire.absent_answer(path, _sandbox_id(headers))
    query = _signed_files_query(path)
    if query is not None:
        try:
            signing.expiration_of(query)
        except RestError as e:
            return wire.rest_answer(e.status, e.message)
        return wire.refused_answer(path, "invalid signature")
    return wire.refused_answer(path)


def spool_places(registry: Registry) -> SpoolPlaces:
    """Where the body of a request to envd's routes is spooled: in the place of the sandbox
    whose access token it carries, or whose token signed its ``/files`` URL (``None``: no
    such sandbox, the site's shared spool)."""

    def place(path: bytes, headers: Headers) -> SpoolPlace | None:
        if not path.split(b"?", 1)[0].startswith(ENVD_ROUTES):
            return None
        sandbox_id = _sandbox_id(headers)
        access = _header(headers, b"x-access-token")
        if access is not None:
            held = registry.holds(sandbox_id, access.decode("utf-8", "replace"))
            return registry.manager.body_place(sandbox_id) if held else None
        query = _signed_files_query(path)
        if query is None:
            return None
        try:
            signer = signing.signer_of(registry, sandbox_id, query)
        except RestError:
            return None  # a malformed expiration: refused by the route
        return None if signer is None else registry.manager.body_place(signer.id)

    return place
