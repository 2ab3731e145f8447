"""Commands and files through agent-sandbox's in-sandbox HTTP runtime, not the API server.

The runtime is upstream's ``examples/python-runtime-sandbox`` server (port 8888), which
the Python client ``k8s-agent-sandbox`` talks to, straight at the pod IP or through the
sandbox router. What it offers, and what rollbox does with it:

- ``GET /`` answers ``{"status": "ok"}``: the reachability probe.
- ``POST /execute {"command": str}`` → ``{stdout, stderr, exit_code}``. The server
  ``shlex.split``\\ s the string and runs the argv without a shell, in its base directory
  (``$SANDBOX_BASE_DIR``, default ``/app``), under its own time limit
  (``$SANDBOX_EXEC_TIMEOUT_SECONDS``, default 300 s; past it the answer is exit code 1 and
  ``Failed to execute command: … timed out``). It takes no timeout, env, cwd or stdin, and
  decodes output as text. So rollbox sends the same argv the pod-exec path builds
  (``timeout -s KILL``, the ``env`` prefix with the exec marker, ``cd``), shell-quoted, and,
  for commands and file reads, inside a small ``sh`` wrapper that caps each stream in the
  pod (``head -c``, the rest is drained, never buffered) and base64-encodes it: output
  stays binary-safe and bounded, and the command sees a pipe it can always write to, as
  under pod exec. rollbox's own scripts (reset, baseline, marker sweep, file moves) go
  unwrapped: their output is short text, and reset must not kill helper processes of the
  command that runs it.
- ``POST /upload`` (multipart field ``file``; its filename is a path under the base
  directory) and ``GET /download/{path}`` (under the base directory only, 403 outside,
  404 when missing). Writes upload to a staging file in the base directory and move it
  into place with one command (parents, mode, any path); reads inside the base directory
  download, others ``cat`` through the wrapper.

A connection that breaks while a command runs leaves that command's outcome unknown:
the sandbox is marked lost (SandboxLostError, as when its pod vanishes under pod exec).
"""

from __future__ import annotations

import base64
import json
import posixpath
import re
import secrets
import shlex
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import aiohttp
from rollbox.errors import ExecTimeoutError, SandboxError, SandboxLostError, WorkloadError

from rollbox_kubernetes.podexec import DEADLINE_GRACE_S, ExecOutput

if TYPE_CHECKING:
    from rollbox_kubernetes.sandbox import KubeSandbox

DEFAULT_PORT = 8888
RUNTIME_FAILED = "Failed to execute command: "
# $1 the cap in bytes, $2 the directory to run in (the container's workingDir, where pod
# exec starts; the runtime starts in its base directory), $3 a fresh token naming the
# wrapper's two fifos in $TMPDIR or /tmp; the rest is the command. Each stream goes
# through a fifo to a reader that base64s the first $1 bytes straight into the runtime's
# own stdout (the command's stdout) or stderr (its stderr) and drains the rest, so the
# command never blocks or gets SIGPIPE, and its output never touches the sandbox's disk
# (a full disk cannot lose it). Then stdout gets a "-" line and the exit status ("-" is
# not in base64's alphabet). A sandbox that cannot take even the fifos (no inode left)
# exits CAPTURE_FAILED. dash writes its "Killed" note for a killed command to the fd 2
# in force while it waits: the subshell keeps it out of the command's stderr, and the
# wrapper's own fd 2 goes to /dev/null once the fifos are made, which keeps it out of the
# runtime's. Few processes: each costs a fork and exec per command.
CAPTURE_FAILED = 124
_WRAP = """n=$1 p=${TMPDIR:-/tmp}/.rollbox-out-$3
cd -- "$2" || exit 125
shift 3
mkfifo -m 600 "$p.o" "$p.e" || exit 124
trap 'rm -f "$p.o" "$p.e"' EXIT
exec 3>&2 2> /dev/null
{ head -c "$n" | base64; cat > /dev/null; } < "$p.o" &
{ head -c "$n" | base64 >&3; cat > /dev/null; } < "$p.e" &
( exec "$@" < /dev/null > "$p.o" 2> "$p.e" 3>&- )
c=$?
wait
echo -
echo "$c"
"""
_FRAME = re.compile(r"([A-Za-z0-9+/=\n]*)-\n([0-9]+)\n")
_BASE64 = re.compile(r"[A-Za-z0-9+/=\n]*")
# $1 target, $2 octal mode, $3 the uploaded staging file.
_PLACE = """mkdir -p -- "$(dirname -- "$1")" || { rm -f -- "$3"; exit 3; }
cat -- "$3" > "$1" && chmod "$2" "$1"; c=$?
rm -f -- "$3"
exit $c
"""


class RuntimeLimitError(ExecTimeoutError):
    """The runtime killed a command at its own time limit, before rollbox's timeout."""


class RuntimeGone(Exception):
    """The runtime did not answer (nothing was sent, or nothing came back)."""


class RuntimeHttp:
    """One sandbox's runtime, at ``url`` (the pod IP, or a router with ``headers``)."""

    def __init__(self, session: aiohttp.ClientSession, url: str, sandbox: KubeSandbox, *,
                 headers: Mapping[str, str] | None = None, stats: Counter[str] | None = None,
                 max_timeout_s: float | None = None) -> None:
        self.session = session
        self.url = url.rstrip("/")
        self.sandbox = sandbox
        self.headers = dict(headers or {})
        self.stats: Counter[str] = stats if stats is not None else Counter()
        self.max_timeout_s = max_timeout_s
        self.base_dir = ""
        self.failure = ""

    # -- requests ----------------------------------------------------------------------

    async def _request(self, endpoint: str, method: str, path: str, *, timeout_s: float,
                       **kwargs: Any) -> tuple[int, bytes]:
        """(status, body). Connection failures and timeouts raise RuntimeGone and
        TimeoutError; what they mean for the sandbox is the caller's to decide."""
        sandbox = self.sandbox
        if sandbox.closed or sandbox.lost or self.session.closed:
            why = "is closed" if sandbox.closed or self.session.closed else "is lost"
            raise SandboxLostError(f"sandbox {sandbox.id} {why}", sandbox_id=sandbox.id)
        self.stats[endpoint] += 1
        headers = dict(self.headers)
        if "X-Sandbox-ID" in headers:  # through a router: tell it how long to wait
            headers["X-Sandbox-Timeout"] = f"{timeout_s:g}"
        try:
            async with self.session.request(
                method, self.url + path, headers=headers, allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=timeout_s), **kwargs,
            ) as response:
                return response.status, await response.read()
        except TimeoutError:
            raise
        except aiohttp.ClientError as exc:
            raise RuntimeGone(f"{type(exc).__name__}: {exc}") from exc

    async def probe(self, timeout_s: float) -> bool:
        """True when the runtime answers ``GET /`` and runs a command through the output
        wrapper (so the image has what it needs); learns the runtime's base directory
        (where ``/execute`` starts and the file endpoints are rooted). ``failure`` says
        why not."""
        try:
            status, body = await self._request("probe", "GET", "/", timeout_s=timeout_s)
            if status != 200 or b'"ok"' not in body:
                self.failure = f"GET / answered {status}: {body[:100]!r}"
                return False
            out = await self._wrapped(["pwd"], ".", limit=4096,
                                      timeout_s=max(timeout_s, 5.0), probing=True)
        except (RuntimeGone, TimeoutError, SandboxError) as exc:
            self.failure = f"{type(exc).__name__}: {exc}"
            return False
        if out.exit_code != 0 or not out.stdout.startswith(b"/"):
            self.failure = (f"it cannot run rollbox's output wrapper (needs sh, mkfifo, head, "
                            f"cat, base64, rm): {out.failure or out.stderr[:200]!r}")
            return False
        self.base_dir = out.stdout.decode(errors="replace").strip()
        return True

    async def _execute(self, command: str, *, timeout_s: float
                       ) -> tuple[str, str, int] | None:
        status, body = await self._request("execute", "POST", "/execute",
                                           json={"command": command}, timeout_s=timeout_s)
        if status != 200:
            return None
        try:
            data = json.loads(body)
            return str(data["stdout"]), str(data["stderr"]), int(data["exit_code"])
        except (ValueError, KeyError, TypeError):
            return None

    # -- commands ----------------------------------------------------------------------

    def can_run(self, timeout_s: float) -> bool:
        """The runtime kills commands at its own limit; longer ones go through pod exec."""
        return self.max_timeout_s is None or timeout_s <= self.max_timeout_s

    async def exec(self, argv: list[str], *, limit: int, timeout_s: float,
                   raw: bool = False) -> ExecOutput:
        """Run ``argv`` (the pod-exec path's argv, unchanged) and collect its output.
        ``raw``: rollbox's own short-output scripts, sent without the capping wrapper."""
        if raw:
            return await self._send(shlex.join(argv), limit, timeout_s, raw=True)
        return await self._wrapped(argv, self.sandbox.spec.workdir, limit=limit,
                                   timeout_s=timeout_s)

    async def _wrapped(self, argv: list[str], cwd: str, *, limit: int, timeout_s: float,
                       probing: bool = False) -> ExecOutput:
        command = shlex.join(["/bin/sh", "-c", _WRAP, "sh", str(limit + 1), cwd,
                              secrets.token_hex(8), *argv])
        return await self._send(command, limit, timeout_s, raw=False, probing=probing)

    async def _send(self, command: str, limit: int, timeout_s: float, *, raw: bool,
                    probing: bool = False) -> ExecOutput:
        """``probing``: a broken connection is the probe's failure, not a lost sandbox."""
        try:
            answer = await self._execute(command, timeout_s=timeout_s + DEADLINE_GRACE_S)
        except RuntimeGone as exc:
            if probing:
                raise
            raise self._lost(f"the connection to its runtime at {self.url} broke during "
                             f"the command ({exc})") from None
        if answer is None and probing:
            return ExecOutput(None, b"", b"", False, False,
                              failure="no usable answer to /execute")
        if answer is None:
            raise self._lost(f"its runtime at {self.url} gave no usable answer to /execute")
        stdout, stderr, code = answer
        if code == 1 and not stdout and stderr.startswith(RUNTIME_FAILED):
            return self._runtime_failure(stderr, timeout_s)
        if raw:
            out, err = stdout.encode(), stderr.encode()
            return ExecOutput(code, out[:limit], err[:limit], len(out) > limit,
                              len(err) > limit)
        return self._unwrap(stdout, stderr, code, limit)

    def _unwrap(self, stdout: str, stderr: str, code: int, limit: int) -> ExecOutput:
        framed = _FRAME.fullmatch(stdout)
        if code == CAPTURE_FAILED and framed is None:
            raise WorkloadError(
                f"sandbox {self.sandbox.id} cannot take a command's two fifos: "
                f"{stderr.strip()[:200]} (its own files filled its disk)",
                sandbox_id=self.sandbox.id, cause="disk")
        if code != 0 or framed is None or not _BASE64.fullmatch(stderr):
            return ExecOutput(None, b"", stderr.encode()[:limit], False, False,
                              failure=f"the runtime's command wrapper failed (exit {code}): "
                                      f"{stderr.strip()[:300]}")
        try:
            out, err = base64.b64decode(framed[1]), base64.b64decode(stderr)
        except ValueError:
            return ExecOutput(None, b"", b"", False, False,
                              failure="the runtime's command wrapper sent garbled output")
        return ExecOutput(int(framed[2]), out[:limit], err[:limit], len(out) > limit,
                          len(err) > limit)

    def _runtime_failure(self, stderr: str, timeout_s: float) -> ExecOutput:
        """The runtime refused or killed the command itself."""
        limit = re.search(r"timed out after [0-9.]+ seconds", stderr)
        if limit is not None:
            raise RuntimeLimitError(
                f"the sandbox runtime killed the command at its own limit ({limit[0]}), "
                f"before rollbox's {timeout_s}s; raise SANDBOX_EXEC_TIMEOUT_SECONDS in the "
                "image, or set the backend's runtime_max_timeout_s to that limit so longer "
                "commands go through pod exec",
                sandbox_id=self.sandbox.id, timeout_s=timeout_s)
        return ExecOutput(None, b"", stderr.encode(), False, False,
                          failure=f"the sandbox runtime could not run it: {stderr.strip()[:300]}")

    def _lost(self, why: str) -> SandboxLostError:
        self.sandbox.lost = True
        return SandboxLostError(f"sandbox {self.sandbox.id} (pod {self.sandbox.pod}): {why}; "
                                "its command's outcome is unknown", sandbox_id=self.sandbox.id)

    # -- files -------------------------------------------------------------------------

    def _under_base(self, target: str) -> str | None:
        """``target`` relative to the base directory, or None when it is outside."""
        base = self.base_dir
        if base == "/":
            return target.lstrip("/") or None
        if target.startswith(base + "/"):
            return target[len(base) + 1:]
        return None

    async def read_file(self, target: str, limit: int, timeout_s: float) -> bytes | None:
        """The file's first ``limit`` bytes, or None when the download endpoint cannot
        serve it (outside the base directory, missing, a symlink out of it): the caller
        then reads it with ``cat`` and gets its own error."""
        rel = self._under_base(target)
        if rel is None:
            return None
        try:
            status, body = await self._request("download", "GET",
                                               "/download/" + quote(rel, safe=""),
                                               timeout_s=timeout_s)
        except RuntimeGone as exc:
            raise self._lost(f"its runtime at {self.url} stopped answering ({exc})") from None
        return body[:limit] if status == 200 else None

    async def write_file(self, target: str, data: bytes, mode: int, timeout_s: float
                         ) -> ExecOutput | None:
        """Upload to a staging file in the base directory, then move it to ``target``
        with one command. None when the runtime refuses the upload (the caller then
        writes through pod exec)."""
        staging = f".rollbox-upload-{secrets.token_hex(8)}"
        form = aiohttp.FormData()
        form.add_field("file", data, filename=staging,
                       content_type="application/octet-stream")
        try:
            status, _ = await self._request("upload", "POST", "/upload", data=form,
                                            timeout_s=timeout_s)
        except RuntimeGone as exc:
            raise self._lost(f"its runtime at {self.url} stopped answering ({exc})") from None
        if status != 200:
            return None
        argv = ["timeout", "-s", "KILL", f"{timeout_s:.3f}", "/bin/sh", "-c", _PLACE, "sh",
                target, f"{mode:o}", posixpath.join(self.base_dir, staging)]
        return await self.exec(argv, limit=64 * 1024, timeout_s=timeout_s, raw=True)
