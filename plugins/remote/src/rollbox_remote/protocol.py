"""The wire format of ``rollbox serve`` and its client, the ``remote`` backend.

HTTP/1.1 with JSON bodies, raw bytes for files, and WebSockets for streaming commands
and port tunnels; every request carries ``Authorization: Bearer TOKEN``. The routes
(docs/serve.md has the full table)::

    GET    /v1/health                          server, backend, capabilities
    GET    /metrics                            Prometheus text
    POST   /v1/sandboxes                       {spec, owner, client} → sandbox info (pool)
    GET    /v1/sandboxes[?owner=O&client=C]    [sandbox info]
    DELETE /v1/sandboxes?owner=O               close every sandbox of O
    GET    /v1/sandboxes/{id}                  sandbox info (what ``attach`` reads)
    DELETE /v1/sandboxes/{id}[?outcome=broken] close: back to the pool (reset) or gone
    POST   /v1/sandboxes/{id}/exec             ExecRequest → ExecResult
    GET    /v1/sandboxes/{id}/stream           WebSocket: a streaming command
    GET    /v1/sandboxes/{id}/files?path=P     raw bytes
    PUT    /v1/sandboxes/{id}/files?path=P&mode=644   raw bytes
    POST   /v1/sandboxes/{id}/reset | seal | ping | snapshot
    POST   /v1/sandboxes/{id}/ports/{port}     {headers} (the port can be reached)
    GET    /v1/sandboxes/{id}/ports/{port}     WebSocket: one TCP connection to the port
    POST   /v1/snapshots/{id}/fork             {owner, client} → sandbox info
    DELETE /v1/snapshots/{id}
    POST   /v1/warm {owner, spec, count} | /v1/hints {owner, images} | /v1/prefetch {image}

Errors are ``{"error": ERROR}`` with a 4xx/5xx status; ``ERROR`` names the error's
class and its bases so the client raises the same type with the same ``retryable``.
Everything here is plain data in, plain data out: no I/O.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import functools
import json
import types
import typing
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from rollbox import errors
from rollbox.errors import InvalidSpecError, RollboxError, UsageError
from rollbox.sandbox import ExecRequest, ExecResult, Snapshot
from rollbox.spec import SandboxSpec

VERSION = "v1"
PREFIX = f"/{VERSION}"
STDIN, STDOUT, STDERR = 0, 1, 2
"""First byte of a binary WebSocket message of a streaming command: which stream."""
STREAM_NAMES = {STDOUT: "stdout", STDERR: "stderr"}

Json = dict[str, Any]


# -- specs -------------------------------------------------------------------------------


def spec_to_json(spec: SandboxSpec) -> Json:
    """Every field of ``spec`` as JSON data (nested dataclasses as objects)."""
    data = _to_json(spec)
    assert isinstance(data, dict)
    return data


def spec_from_json(data: object) -> SandboxSpec:
    """The ``SandboxSpec`` that ``spec_to_json`` encoded; InvalidSpecError if malformed
    (unknown fields included, so a newer client never loses a field silently).

    Specs are frozen, and clients send the same few again and again: decoded ones are
    remembered by their canonical JSON."""
    try:
        key = json.dumps(data, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):
        key = None
    if key is not None and key in _DECODED:
        _DECODED.move_to_end(key)
        return _DECODED[key]
    spec = _from_json(SandboxSpec, data, "spec")
    assert isinstance(spec, SandboxSpec)
    if key is not None:
        _DECODED[key] = spec
        if len(_DECODED) > 4096:
            _DECODED.popitem(last=False)
    return spec


_DECODED: OrderedDict[str, SandboxSpec] = OrderedDict()


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _to_json(value: object) -> object:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): _to_json(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_to_json(v) for v in value]
    return value


def _from_json(hint: Any, data: object, where: str) -> object:
    """Decode ``data`` as the type ``hint`` (a dataclass, enum, tuple, mapping, scalar
    or a union of them with None)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        if data is None:
            return None
        return _from_json(options[0] if len(options) == 1 else Any, data, where)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if not isinstance(data, dict):
            raise InvalidSpecError(f"{where} must be an object, got {type(data).__name__}")
        hints = _hints(hint)
        fields = {f.name for f in dataclasses.fields(hint) if f.init}
        unknown = sorted(set(data) - fields)
        if unknown:
            raise InvalidSpecError(f"{where} has unknown fields {unknown}; is the server older "
                                   "than the client?")
        values = {k: _from_json(hints[k], v, f"{where}.{k}") for k, v in data.items()}
        try:
            return hint(**values)
        except TypeError as exc:
            raise InvalidSpecError(f"{where}: {exc}") from None
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return hint(data)
        except ValueError:
            raise InvalidSpecError(f"{where} cannot be {data!r}") from None
    if origin is tuple:
        if not isinstance(data, list):
            raise InvalidSpecError(f"{where} must be a list")
        args = typing.get_args(hint)
        item = args[0] if args else Any
        return tuple(_from_json(item, v, where) for v in data)
    if origin is not None and isinstance(origin, type) and issubclass(origin, Mapping):
        if not isinstance(data, dict):
            raise InvalidSpecError(f"{where} must be an object")
        return data
    return data


# -- commands ----------------------------------------------------------------------------


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: object, where: str = "data") -> bytes:
    if not isinstance(text, str):
        raise UsageError(f"{where} must be a base64 string")
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise UsageError(f"{where} is not valid base64") from None


def request_to_json(request: ExecRequest, *, with_stdin: bool = True) -> Json:
    return {
        "argv": list(request.argv), "cwd": request.cwd, "env": dict(request.env),
        "stdin": b64(request.stdin) if with_stdin and request.stdin is not None else None,
        "timeout_s": request.timeout_s, "output_limit": request.output_limit,
    }


def request_from_json(data: object) -> ExecRequest:
    """An ExecRequest from JSON, every field checked (UsageError if malformed)."""
    if not isinstance(data, dict):
        raise UsageError("an exec request must be a JSON object")
    argv = data.get("argv")
    if (not isinstance(argv, list) or not argv
            or not all(isinstance(a, str) and "\0" not in a for a in argv)):
        raise UsageError("argv must be a non-empty list of strings without NUL")
    cwd = data.get("cwd")
    if not isinstance(cwd, str) or not cwd.startswith("/") or "\0" in cwd:
        raise UsageError("cwd must be an absolute path")
    env = data.get("env")
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and k and "=" not in k
        and "\0" not in k + v for k, v in env.items()
    ):
        raise UsageError("env must map variable names to strings without NUL")
    timeout = data.get("timeout_s")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise UsageError("timeout_s must be a positive number")
    limit = data.get("output_limit")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
        raise UsageError("output_limit must be a positive int")
    stdin = data.get("stdin")
    return ExecRequest(
        argv=tuple(argv), cwd=cwd, env=env, timeout_s=float(timeout), output_limit=limit,
        stdin=None if stdin is None else unb64(stdin, "stdin"),
    )


def result_to_json(result: ExecResult) -> Json:
    return {
        "exit_code": result.exit_code, "stdout": b64(result.stdout),
        "stderr": b64(result.stderr), "duration_s": result.duration_s,
        "stdout_truncated": result.stdout_truncated,
        "stderr_truncated": result.stderr_truncated,
    }


def result_from_json(data: Json) -> ExecResult:
    return ExecResult(
        exit_code=int(data["exit_code"]), stdout=unb64(data["stdout"]),
        stderr=unb64(data["stderr"]), duration_s=float(data["duration_s"]),
        stdout_truncated=bool(data["stdout_truncated"]),
        stderr_truncated=bool(data["stderr_truncated"]),
    )


def snapshot_to_json(snapshot: Snapshot) -> Json:
    """A snapshot as the server hands it out: its handle and spec (backend details such
    as host paths stay on the server)."""
    return {"id": snapshot.id, "spec": spec_to_json(snapshot.spec)}


# -- errors ------------------------------------------------------------------------------


def error_to_json(error: RollboxError) -> Json:
    """The error's class, its bases up to RollboxError, and its attributes."""
    names = [c.__name__ for c in type(error).__mro__
             if isinstance(c, type) and issubclass(c, RollboxError)]
    attrs: Json = {}
    for key, value in vars(error).items():
        if key.startswith("_") or key == "message":
            continue
        if isinstance(value, bytes):
            attrs[key] = {"b64": b64(value)}
        elif value is None or isinstance(value, str | int | float | bool):
            attrs[key] = value
    return {"type": names[0], "types": names, "kind": error.kind, "message": error.message,
            "retryable": error.retryable, "attrs": attrs}


def error_from_json(data: object) -> RollboxError:
    """The error ``error_to_json`` described, as the nearest class this process knows,
    with the sender's ``retryable`` and ``kind`` kept."""
    if not isinstance(data, dict) or not isinstance(data.get("message"), str):
        return RollboxError(f"the server sent a malformed error: {data!r:.200}")
    names = data.get("types") if isinstance(data.get("types"), list) else []
    known = _error_classes()
    cls: type[RollboxError] = RollboxError
    for name in names or [data.get("type")]:
        if isinstance(name, str) and name in known:
            cls = known[name]
            break
    retryable, kind = bool(data.get("retryable")), str(data.get("kind") or cls.kind)
    if cls.retryable != retryable or cls.kind != kind:
        cls = _variant(cls, retryable, kind)
    error = cls.__new__(cls)
    Exception.__init__(error, data["message"])
    error.message = data["message"]
    attrs = data.get("attrs")
    for key, value in (attrs.items() if isinstance(attrs, dict) else ()):
        if isinstance(key, str) and not key.startswith("_") and key != "message":
            if isinstance(value, dict) and isinstance(value.get("b64"), str):
                value = unb64(value["b64"])
            setattr(error, key, value)
    if isinstance(error, errors.SandboxError) and not hasattr(error, "sandbox_id"):
        error.sandbox_id = None
    return error


def _error_classes() -> dict[str, type[RollboxError]]:
    found: dict[str, type[RollboxError]] = {}
    todo: list[type[RollboxError]] = [RollboxError]
    while todo:
        cls = todo.pop()
        found.setdefault(cls.__name__, cls)
        todo.extend(cls.__subclasses__())
    return found


_VARIANTS: dict[tuple[type[RollboxError], bool, str], type[RollboxError]] = {}


def _variant(cls: type[RollboxError], retryable: bool, kind: str) -> type[RollboxError]:
    """A subclass of ``cls`` with the sender's ``retryable`` and ``kind``: for an error
    class this process does not know, raised as its nearest known base."""
    key = (cls, retryable, kind)
    if key not in _VARIANTS:
        _VARIANTS[key] = type(cls.__name__, (cls,), {"retryable": retryable, "kind": kind,
                                                      "__module__": cls.__module__})
    return _VARIANTS[key]


def status_of(error: RollboxError) -> int:
    """The HTTP status a server answers ``error`` with (the body says the rest)."""
    if isinstance(error, errors.AuthenticationError):
        return 401
    if isinstance(error, errors.SandboxNotFoundError):
        return 404
    if isinstance(error, UsageError):
        return 400
    if error.retryable:
        return 503
    return 409 if isinstance(error, errors.SandboxError) else 500
