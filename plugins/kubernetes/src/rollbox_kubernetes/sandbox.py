"""A sandbox that is one pod: commands, files and reset all go through pod exec.

Commands run as their argv when cwd and env are the container's own (the common case);
otherwise through ``env -i … /bin/sh -c 'cd …'``. Each command is wrapped in coreutils'
``timeout -s KILL`` so an overrun kills its process group inside the pod: closing an exec
stream does not stop the process on Kubernetes.
"""

from __future__ import annotations

import asyncio
import base64
import shlex
from typing import TYPE_CHECKING

from rollbox.errors import (
    CommandNotFoundError,
    ExecTimeoutError,
    ResetFailedError,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxLostError,
)
from rollbox.sandbox import ExecRequest, ExecResult, Sandbox, resolve_path
from rollbox.spec import MiB, SandboxSpec

from rollbox_kubernetes.client import ApiError
from rollbox_kubernetes.podexec import ExecOutput, pod_exec
from rollbox_kubernetes.render import CONTAINER

if TYPE_CHECKING:
    from rollbox_kubernetes.backend import KubernetesBackend

KILLED = 128 + 9
_GRACE_S = 10.0
_WRITE = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1" && chmod "$2" "$1"'
_APPEND_B64 = 'printf %s "$2" | base64 -d >> "$1"'
_TRUNCATE = 'mkdir -p -- "$(dirname -- "$1")" && : > "$1" && chmod "$2" "$1"'
_GIT_HEAD = 'cd -- "$1" && git rev-parse HEAD'
_GIT_RESET = 'cd -- "$1" && git reset -q --hard "$2" && git clean -q -xdff'
_ARGV_CHUNK = 96 * 1024


class KubeSandbox(Sandbox):
    """One pod, owned by a SandboxClaim (claim mode) or by nobody (raw-pod mode)."""

    def __init__(self, backend: KubernetesBackend, sandbox_id: str, spec: SandboxSpec, *,
                 pod: str, base_env: dict[str, str]) -> None:
        super().__init__(sandbox_id, spec)
        self.backend = backend
        self.pod = pod
        self.base_env = base_env
        self.base_commit: str | None = None
        self.closed = False

    # -- exec --------------------------------------------------------------------------

    def argv_for(self, request: ExecRequest) -> list[str]:
        argv = list(request.argv)
        if request.cwd != self.spec.workdir or dict(request.env) != self.base_env:
            pairs = [f"{k}={v}" for k, v in request.env.items()]
            argv = ["env", "-i", *pairs, "/bin/sh", "-c", 'cd -- "$0" && exec "$@"',
                    request.cwd, *argv]
        return ["timeout", "-s", "KILL", f"{request.timeout_s:.3f}", *argv]

    async def _exec(self, argv: list[str], *, stdin: bytes | None, limit: int,
                    timeout_s: float) -> ExecOutput:
        if self.closed:
            raise SandboxLostError(f"sandbox {self.id} is closed", sandbox_id=self.id)
        try:
            async with asyncio.timeout(timeout_s + _GRACE_S):
                return await pod_exec(
                    self.backend.client, self.backend.ws_api, self.backend.options.namespace,
                    self.pod, argv, container=CONTAINER, stdin=stdin, output_limit=limit,
                )
        except ApiError as err:
            if err.status == 404:
                raise SandboxLostError(f"pod {self.pod} of sandbox {self.id} is gone",
                                       sandbox_id=self.id) from None
            raise SandboxLostError(f"exec in pod {self.pod} failed: {err}",
                                   sandbox_id=self.id) from None

    async def run(self, request: ExecRequest) -> ExecResult:
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            out = await self._exec(self.argv_for(request), stdin=request.stdin,
                                   limit=request.output_limit, timeout_s=request.timeout_s)
        except TimeoutError:
            raise ExecTimeoutError(
                f"command {shlex.join(request.argv)!r} overran {request.timeout_s}s and its "
                "exec stream did not end", sandbox_id=self.id, timeout_s=request.timeout_s,
            ) from None
        elapsed = loop.time() - started
        if out.exit_code is None:
            if "executable file not found" in out.failure or "no such file" in out.failure:
                raise CommandNotFoundError(out.failure, sandbox_id=self.id)
            raise SandboxLostError(f"exec in pod {self.pod}: {out.failure}", sandbox_id=self.id)
        if out.exit_code == KILLED and elapsed >= request.timeout_s * 0.99:
            raise ExecTimeoutError(
                f"command {shlex.join(request.argv)!r} overran {request.timeout_s}s; killed",
                sandbox_id=self.id, timeout_s=request.timeout_s, stdout=out.stdout,
                stderr=out.stderr,
            )
        if out.exit_code == 127 and not out.stdout and out.stderr.startswith(
            (b"timeout: failed to run command", b"env: ")
        ):
            raise CommandNotFoundError(
                f"{request.argv[0]}: command not found in image {self.spec.image}",
                sandbox_id=self.id,
            )
        return ExecResult(
            exit_code=out.exit_code, stdout=out.stdout, stderr=out.stderr, duration_s=elapsed,
            stdout_truncated=out.stdout_truncated, stderr_truncated=out.stderr_truncated,
        )

    async def _sh(self, script: str, *args: str, stdin: bytes | None = None,
                  timeout_s: float = 60.0) -> ExecOutput:
        argv = ["timeout", "-s", "KILL", f"{timeout_s:.3f}", "/bin/sh", "-c", script, "sh", *args]
        out = await self._exec(argv, stdin=stdin, limit=MiB, timeout_s=timeout_s)
        if out.exit_code is None:
            raise SandboxLostError(f"exec in pod {self.pod}: {out.failure}", sandbox_id=self.id)
        return out

    # -- files -------------------------------------------------------------------------

    async def read_file(self, path: str) -> bytes:
        target = resolve_path(path, self.spec.workdir)
        limit = self.spec.resources.file_size_mb * MiB
        out = await self._exec(["cat", "--", target], stdin=None, limit=limit,
                               timeout_s=self.spec.timeouts.exec_s)
        if out.exit_code != 0:
            detail = out.stderr.decode("utf-8", "replace").strip() or out.failure
            raise SandboxFileNotFoundError(f"cannot read {target} in sandbox {self.id}: "
                                           f"{detail}", sandbox_id=self.id)
        return out.stdout

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        target = resolve_path(path, self.spec.workdir)
        try:
            out = await self._sh(_WRITE, target, f"{mode & 0o7777:o}", stdin=bytes(data))
        except SandboxLostError as exc:
            if "v5.channel" not in exc.message:
                raise
            out = await self._write_by_argv(target, bytes(data), mode)
        if out.exit_code != 0:
            raise SandboxError(f"cannot write {target} in sandbox {self.id}: "
                               f"{out.stderr.decode('utf-8', 'replace').strip()}",
                               sandbox_id=self.id)

    async def _write_by_argv(self, target: str, data: bytes, mode: int) -> ExecOutput:
        """For API servers without v5 (no stdin EOF): base64 in argv, in chunks."""
        out = await self._sh(_TRUNCATE, target, f"{mode & 0o7777:o}")
        for start in range(0, len(data), _ARGV_CHUNK):
            if out.exit_code != 0:
                break
            chunk = base64.b64encode(data[start:start + _ARGV_CHUNK]).decode()
            out = await self._sh(_APPEND_B64, target, chunk)
        return out

    # -- reset and close ---------------------------------------------------------------

    async def remember_base(self) -> None:
        """Record the workdir's git commit so reset can return to it (default reset)."""
        out = await self._sh(_GIT_HEAD, self.spec.workdir, timeout_s=self.spec.timeouts.reset_s)
        if out.exit_code == 0:
            self.base_commit = out.stdout.decode().strip() or None

    async def reset(self) -> None:
        timeout = self.spec.timeouts.reset_s
        if self.spec.reset_command is not None:
            out = await self._sh(f'cd -- "$1" && {self.spec.reset_command}', self.spec.workdir,
                                 timeout_s=timeout)
        elif self.base_commit is None:
            raise ResetFailedError(
                f"cannot reset sandbox {self.id}: {self.spec.workdir} is not a git checkout; "
                "set SandboxSpec.reset_command to a command that restores it",
                sandbox_id=self.id,
            )
        else:
            out = await self._sh(_GIT_RESET, self.spec.workdir, self.base_commit,
                                 timeout_s=timeout)
        if out.exit_code != 0:
            raise ResetFailedError(
                f"reset of sandbox {self.id} exited {out.exit_code}: "
                f"{out.stderr.decode('utf-8', 'replace').strip()[:300]}", sandbox_id=self.id,
            )

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        await self.backend.release(self)
