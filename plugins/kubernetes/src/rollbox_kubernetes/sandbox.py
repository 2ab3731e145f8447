"""A sandbox that is one pod: commands, files and reset all go through pod exec.

Commands run as their argv when cwd and env are the container's own (the common case);
otherwise through ``env -i … /bin/sh -c 'cd …'``. Each command is wrapped in coreutils'
``timeout -s KILL`` so an overrun kills its process group inside the pod: closing an exec
stream does not stop the process on Kubernetes.

Reset, in the pod, without restarting it (a container restart would drop the writable
layer, but the kubelet's crash-loop back-off makes repeated restarts slow):

1. every process but the container's init (``sleep infinity``) is killed, daemons too;
2. ``/tmp``, ``/var/tmp`` and ``$HOME`` are put back as they were when the sandbox was
   created (a tar taken then, kept in ``/tmp/.rollbox-base``);
3. the workdir goes back to its git commit at create (``git reset --hard && git clean
   -xdff``), or, when it is not a checkout, to the same tar; then the spec's
   ``reset_command`` runs, if it names one.

Files the rollout changed anywhere else in the image (``/etc``, ``/usr`` …) are not
restored: give the spec a ``reset_command`` that does, or keep such changes in the
workdir. A workdir of ``/`` that is not a checkout needs a ``reset_command``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import secrets
import shlex
from typing import TYPE_CHECKING

from rollbox.errors import (
    CommandNotFoundError,
    ExecTimeoutError,
    ResetFailedError,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxLostError,
    WorkloadError,
)
from rollbox.sandbox import (
    Endpoint,
    ExecRequest,
    ExecResult,
    Process,
    Sandbox,
    check_port,
    resolve_path,
)
from rollbox.spec import MiB, SandboxSpec

from rollbox_kubernetes.client import ApiError
from rollbox_kubernetes.podexec import DEADLINE_GRACE_S, ExecOutput, pod_exec
from rollbox_kubernetes.podprocess import PodProcess, start_process
from rollbox_kubernetes.render import CONTAINER
from rollbox_kubernetes.resources import PODS
from rollbox_kubernetes.status import pod_ready, workload_failure

if TYPE_CHECKING:
    from rollbox_kubernetes.backend import KubernetesBackend
    from rollbox_kubernetes.runtime_http import RuntimeHttp

KILLED = 128 + 9
_WRITE = 'mkdir -p -- "$(dirname -- "$1")" || exit 3; cat > "$1" && chmod "$2" "$1"'
NO_PARENT = 3
_APPEND_B64 = 'printf %s "$2" | base64 -d >> "$1"'
_TRUNCATE = 'mkdir -p -- "$(dirname -- "$1")" && : > "$1" && chmod "$2" "$1"'
BASE = "/tmp/.rollbox-base"
# $1 workdir, $2 "1" to keep the workdir in the tar when it is not a git checkout.
_REMEMBER = f"""base={BASE}
rm -rf "$base" && mkdir -p "$base" && chmod 700 "$base" || exit 3
if [ "$1" != / ] && cd -- "$1" 2>/dev/null && git rev-parse HEAD > "$base/commit" 2>/dev/null
then :; else rm -f "$base/commit"; fi
dirs="tmp var/tmp"
case "$HOME" in ""|/) ;; *) dirs="$dirs ${{HOME#/}}" ;; esac
if [ ! -f "$base/commit" ] && [ "$2" = 1 ] && [ "$1" != / ]; then dirs="$dirs ${{1#/}}"; fi
keep= absent=
for d in $dirs; do if [ -d "/$d" ]; then keep="$keep $d"; else absent="$absent $d"; fi; done
printf '%s\\n' $keep > "$base/dirs"
printf '%s\\n' $absent > "$base/absent"
cd / && tar -cpf "$base/state.tar" --exclude=./tmp/.rollbox-base $(sed 's|^|./|' "$base/dirs") \
    || exit 4
[ -f "$base/commit" ] && echo git || echo tar
"""
MARKER = "ROLLBOX_EXEC"
# $1 the marker (NAME=token): kill every process whose environment carries it.
_SWEEP = """for round in 1 2 3 4 5 6 7 8; do
  found=
  for d in /proc/[0-9]*; do
    if tr '\\0' '\\n' < "$d/environ" 2>/dev/null | grep -qx -- "$1"; then
      kill -9 "${d#/proc/}" 2>/dev/null && found=1
    fi
  done
  [ -n "$found" ] || break
done
"""
# Kills every process but init and this script's ancestors (what seal and reset end).
_END_WORKLOAD = """keep=" 1 $$ "; p=$$
while [ "$p" -gt 1 ] 2>/dev/null; do
  p=$(sed -n 's/^PPid:[[:space:]]*//p' "/proc/$p/status" 2>/dev/null); keep="$keep$p "
done
for round in 1 2 3 4 5 6 7 8; do
  found=
  for d in /proc/[0-9]*; do
    pid=${d#/proc/}
    case "$keep" in *" $pid "*) continue ;; esac
    kill -9 "$pid" 2>/dev/null && found=1
  done
  [ -n "$found" ] || break
done
"""
# A survivor fails the seal, but for a fork of the container's init that has not exec'd
# (a runtime's own helper: a real pod's init, ``sleep``, never forks; orphans it adopts
# run programs of their own). On a loaded machine a process SIGKILLed by the rounds above
# may not have run its exit yet: it is killed again and given 5 s before it counts.
_SEAL = _END_WORKLOAD + """init=$(tr '\\0' ' ' < /proc/1/cmdline 2>/dev/null)
lives() {
  n=0
  while [ "$n" -lt 50 ]; do
    [ -n "$(tr '\\0' ' ' < "/proc/$1/cmdline" 2>/dev/null)" ] || return 1
    kill -9 "$1" 2>/dev/null; sleep 0.1; n=$((n + 1))
  done
}
for d in /proc/[0-9]*; do
  pid=${d#/proc/}
  case "$keep" in *" $pid "*) continue ;; esac
  cmd=$(tr '\\0' ' ' < "$d/cmdline" 2>/dev/null)
  [ -n "$cmd" ] || continue
  parent=$(sed -n 's/^PPid:[[:space:]]*//p' "$d/status" 2>/dev/null)
  [ "$parent" = 1 ] && [ "$cmd" = "$init" ] && continue
  lives "$pid" || continue
  echo "process $pid ($cmd) would not die" >&2; exit 4
done
exit 0
"""
# $1 workdir. Ends every process but init and this script's ancestors, then restores.
_RESET = f"""base={BASE}
[ -f "$base/state.tar" ] || {{ echo "reset baseline $base is gone" >&2; exit 3; }}
{_END_WORKLOAD}while read -r d; do
  find "/$d" -mindepth 1 -maxdepth 1 ! -path "$base" -exec rm -rf {{}} + || exit 5
done < "$base/dirs"
while read -r d; do [ -z "$d" ] || rm -rf "/$d" || exit 5; done < "$base/absent"
cd / && tar -xpf "$base/state.tar" || exit 6
if [ -f "$base/commit" ]; then
  cd -- "$1" && git reset -q --hard "$(cat "$base/commit")" && git clean -q -xdff || exit 7
fi
"""
_ARGV_CHUNK = 64 * 1024  # base64 of 96 KiB is 131072 chars: one over MAX_ARG_STRLEN with its NUL


class KubeSandbox(Sandbox):
    """One pod, owned by a SandboxClaim (claim mode) or by nobody (raw-pod mode)."""

    def __init__(self, backend: KubernetesBackend, sandbox_id: str, spec: SandboxSpec, *,
                 pod: str, base_env: dict[str, str], pod_ip: str = "",
                 pod_uid: str = "") -> None:
        super().__init__(sandbox_id, spec)
        self.backend = backend
        self.pod = pod
        self.pod_uid = pod_uid
        """The uid of the pod made for this sandbox: a pod of its name with another uid
        was made again, empty (podwatch.py). "" until known."""
        self.base_env = base_env
        self.base_mode = ""
        self.closed = False
        self._release: asyncio.Future[None] | None = None
        self.lost = False
        self.processes: set[PodProcess] = set()
        self._sweeps: set[asyncio.Task[None]] = set()
        self.broken_by: str | None = None
        # Set by transport.attach when the in-sandbox HTTP runtime answers: commands
        # without stdin, and files, then go there instead of through pod exec.
        self.runtime: RuntimeHttp | None = None
        self.pod_ip = pod_ip

    # -- exec --------------------------------------------------------------------------

    def argv_for(self, request: ExecRequest, marker: str) -> list[str]:
        """``marker`` (``ROLLBOX_EXEC=<token>``) is inherited by every process the command
        starts, so a timeout can find the ones that left its process group (setsid)."""
        argv = list(request.argv)
        if request.cwd != self.spec.workdir or dict(request.env) != self.base_env:
            pairs = [f"{k}={v}" for k, v in request.env.items()]
            argv = ["env", "-i", *pairs, marker, "/bin/sh", "-c", 'cd -- "$0" && exec "$@"',
                    request.cwd, *argv]
        else:
            argv = ["env", marker, *argv]
        return ["timeout", "-s", "KILL", f"{request.timeout_s:.3f}", *argv]

    async def _kill_marked(self, marker: str, *, wait_s: float = DEADLINE_GRACE_S) -> None:
        """Kill what a timed-out command left running, daemons included: waits up to
        ``wait_s`` and leaves the sweep running after that (the workload may keep it
        stopped; a caller's deadline holds whatever it does)."""
        sweep = asyncio.ensure_future(self._sweep(marker))
        self._sweeps.add(sweep)
        sweep.add_done_callback(self._sweeps.discard)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(sweep), wait_s)

    async def _sweep(self, marker: str) -> None:
        with contextlib.suppress(SandboxError, TimeoutError):
            await self._sh(_SWEEP, marker, timeout_s=30.0)

    async def _overran(self, what: str, timeout_s: float) -> SandboxError:
        """The error for a command whose exec did not end ``DEADLINE_GRACE_S`` after its
        timeout: the pod's (lost) if it is gone, else the command's (a timeout: its own
        processes kept it, or what kills it, from ending)."""
        await self._check_pod()
        if self.lost:
            return self.gone(f"pod {self.pod} of sandbox {self.id} went away during {what}")
        return ExecTimeoutError(f"{what} overran {timeout_s}s and its exec did not end",
                                sandbox_id=self.id, timeout_s=timeout_s)

    async def _exec(self, argv: list[str], *, stdin: bytes | None, limit: int,
                    timeout_s: float, raw: bool = False) -> ExecOutput:
        """Run ``argv`` by the runtime or pod exec. Raises ExecTimeoutError (or
        SandboxLostError, the pod gone) once ``DEADLINE_GRACE_S`` past ``timeout_s``."""
        if self.closed:
            raise SandboxLostError(f"sandbox {self.id} is closed", sandbox_id=self.id)
        if self.lost:
            raise self.gone(f"pod {self.pod} of sandbox {self.id} is gone")
        try:
            if self.runtime is not None and stdin is None and self.runtime.can_run(timeout_s):
                return await self.runtime.exec(argv, limit=limit, timeout_s=timeout_s, raw=raw)
            async with asyncio.timeout(timeout_s + DEADLINE_GRACE_S):
                return await pod_exec(
                    self.backend.client, self.backend.ws_api, self.backend.options.namespace,
                    self.pod, argv, container=CONTAINER, stdin=stdin, output_limit=limit,
                )
        except TimeoutError:
            raise await self._overran(f"command {shlex.join(argv)[:200]!r}", timeout_s) from None
        except ApiError as err:
            raise self.lost_by(err) from None

    def lost_by(self, err: ApiError) -> SandboxLostError:
        """The error for an exec the API server refused (a 404: the pod is gone)."""
        if err.status == 404:
            self.lost = True
            return SandboxLostError(f"pod {self.pod} of sandbox {self.id} is gone",
                                    sandbox_id=self.id)
        return SandboxLostError(f"exec in pod {self.pod} failed: {err}", sandbox_id=self.id)

    async def run(self, request: ExecRequest) -> ExecResult:
        loop = asyncio.get_running_loop()
        started = loop.time()
        marker = f"{MARKER}={secrets.token_hex(8)}"
        try:
            out = await self._exec(self.argv_for(request, marker), stdin=request.stdin,
                                   limit=request.output_limit, timeout_s=request.timeout_s)
        except ExecTimeoutError:  # its deadline's grace is spent: the sweep goes on behind
            await self._kill_marked(marker, wait_s=0)
            raise
        elapsed = loop.time() - started
        if out.exit_code is None:
            if "executable file not found" in out.failure or "no such file" in out.failure:
                raise CommandNotFoundError(out.failure, sandbox_id=self.id)
            await self._check_pod()
            raise self.gone(f"exec in pod {self.pod}: {out.failure}")
        timed_out = elapsed >= request.timeout_s * 0.99
        if out.exit_code == KILLED and not timed_out:
            await self._check_pod()  # SIGKILL: the pod may be going (deleted, evicted)
            if self.lost:
                raise self.gone(f"pod {self.pod} of sandbox {self.id} went away during the "
                                "command")
        if out.exit_code == KILLED and timed_out:
            await self._kill_marked(marker)
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

    async def start(self, request: ExecRequest) -> Process:
        """Stream a command over one exec WebSocket; signals go by a second exec that
        finds its processes by the marker (see podprocess.py)."""
        marker = f"{MARKER}={secrets.token_hex(8)}"
        return await start_process(self, request, self.argv_for(request, marker), marker)

    async def _check_pod(self) -> None:
        """Mark the sandbox lost if its pod is gone, made again, terminating or no longer
        ready, and remember when that was its own workload's doing (``broken_by``)."""
        try:
            pod = await self.backend.client.get(PODS, self.backend.options.namespace, self.pod)
        except ApiError as err:
            if err.status == 404:
                self.lost = True
            return
        if self.pod_uid and pod["metadata"].get("uid") != self.pod_uid:
            self.lost = True  # another pod under its name: what failed it is not known
            return
        if pod["metadata"].get("deletionTimestamp") or not pod_ready(pod):
            self.lost = True
            self.broken_by = workload_failure(pod)

    def gone(self, message: str) -> SandboxError:
        """The error for a pod found lost: a WorkloadError when its own workload took it
        past its limits (an eviction for its ephemeral storage, an OOM kill), so the
        rollout cannot pass that off as the infrastructure's; else SandboxLostError."""
        if self.broken_by:
            return WorkloadError(f"{message}: {self.broken_by}", sandbox_id=self.id,
                                 cause="limits")
        return SandboxLostError(message, sandbox_id=self.id)

    async def _sh(self, script: str, *args: str, stdin: bytes | None = None,
                  timeout_s: float = 60.0) -> ExecOutput:
        argv = ["timeout", "-s", "KILL", f"{timeout_s:.3f}", "/bin/sh", "-c", script, "sh", *args]
        out = await self._exec(argv, stdin=stdin, limit=MiB, timeout_s=timeout_s, raw=True)
        if out.exit_code is None:
            raise SandboxLostError(f"exec in pod {self.pod}: {out.failure}", sandbox_id=self.id)
        return out

    # -- files -------------------------------------------------------------------------

    async def read_file(self, path: str) -> bytes:
        target = resolve_path(path, self.spec.workdir)
        limit = (self.spec.resources.or_defaults().file_size_mb or 0) * MiB
        if self.runtime is not None:
            try:
                data = await self.runtime.read_file(target, limit, self.spec.timeouts.exec_s)
            except TimeoutError:
                raise await self._overran(f"reading {target}", self.spec.timeouts.exec_s) from None
            if data is not None:
                return data
        out = await self._exec(["cat", "--", target], stdin=None, limit=limit,
                               timeout_s=self.spec.timeouts.exec_s)
        if out.exit_code != 0:
            detail = out.stderr.decode("utf-8", "replace").strip() or out.failure
            raise SandboxFileNotFoundError(f"cannot read {target} in sandbox {self.id}: "
                                           f"{detail}", sandbox_id=self.id)
        return out.stdout

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        target = resolve_path(path, self.spec.workdir)
        out = None
        if self.runtime is not None:
            try:
                out = await self.runtime.write_file(target, bytes(data), mode & 0o7777,
                                                    self.spec.timeouts.exec_s)
            except TimeoutError:
                raise await self._overran(f"writing {target}", self.spec.timeouts.exec_s) from None
        if out is None:
            out = await self._write_by_exec(target, bytes(data), mode)
        if out.exit_code == NO_PARENT:
            raise SandboxFileNotFoundError(
                f"cannot write {target} in sandbox {self.id}: its directory cannot be made "
                f"({out.stderr.decode('utf-8', 'replace').strip()})", sandbox_id=self.id)
        if out.exit_code != 0:
            detail = (out.stderr.decode("utf-8", "replace").strip() or out.failure
                      or f"the write command exited {out.exit_code}")
            raise SandboxError(f"cannot write {target} in sandbox {self.id}: {detail}",
                               sandbox_id=self.id)

    async def _write_by_exec(self, target: str, data: bytes, mode: int) -> ExecOutput:
        try:
            return await self._sh(_WRITE, target, f"{mode & 0o7777:o}", stdin=data,
                                  timeout_s=self.spec.timeouts.exec_s)
        except SandboxLostError as exc:
            if "v5.channel" not in exc.message:
                raise
            return await self._write_by_argv(target, data, mode)

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
        """Record what reset returns to: the workdir's git commit, and a tar of the
        scratch directories (and of the workdir when it is not a checkout)."""
        keep_workdir = "1" if self.spec.reset_command is None else "0"
        out = await self._sh(_REMEMBER, self.spec.workdir, keep_workdir,
                             timeout_s=self.spec.timeouts.reset_s)
        if out.exit_code != 0:
            raise SandboxError(
                f"cannot record the reset baseline of sandbox {self.id} (exit "
                f"{out.exit_code}): {out.stderr.decode('utf-8', 'replace').strip()[:300]}; "
                "the image needs sh, tar, find and sed", sandbox_id=self.id)
        self.base_mode = out.stdout.decode().strip()

    async def reset(self) -> None:
        timeout = self.spec.timeouts.reset_s
        if (self.spec.reset_command is None and self.base_mode != "git"
                and self.spec.workdir == "/"):
            raise ResetFailedError(
                f"cannot reset sandbox {self.id}: its workdir is / and not a git checkout; "
                "set SandboxSpec.workdir to the task's directory or SandboxSpec.reset_command "
                "to a command that restores it", sandbox_id=self.id)
        out = await self._sh(_RESET, self.spec.workdir, timeout_s=timeout)
        if out.exit_code == 0 and self.spec.reset_command is not None:
            out = await self._sh(f'cd -- "$1" && {self.spec.reset_command}', self.spec.workdir,
                                 timeout_s=timeout)
        if out.exit_code != 0:
            raise ResetFailedError(
                f"reset of sandbox {self.id} exited {out.exit_code}: "
                f"{out.stderr.decode('utf-8', 'replace').strip()[:300]}", sandbox_id=self.id,
            )

    async def seal(self) -> None:
        """Kill every process of the pod but its init (the container's ``sleep``), as a
        reset does first, and keep the files.

        A pod has no process of rollbox's that its workload cannot signal: a workload
        that keeps the seal from finishing (stopping it, forking faster than it kills)
        makes it a WorkloadError, the rollout's outcome; a pod gone is a lost sandbox."""
        try:
            out = await self._sh(_SEAL, timeout_s=self.spec.timeouts.reset_s)
        except ExecTimeoutError as exc:
            raise WorkloadError(f"cannot seal sandbox {self.id}: {exc.message}",
                                sandbox_id=self.id, cause="seal") from None
        if out.exit_code != 0:
            await self._check_pod()
            why = (f"cannot seal sandbox {self.id} (exit {out.exit_code}): "
                   f"{out.stderr.decode('utf-8', 'replace').strip()[:300]}")
            if self.lost:
                raise self.gone(why)
            raise WorkloadError(why, sandbox_id=self.id, cause="seal")

    async def endpoint(self, port: int) -> Endpoint:
        """The pod's ``port``, at the pod IP or through the router (``Transports``)."""
        check_port(port)
        if self.closed or self.lost:
            raise SandboxLostError(f"sandbox {self.id} is closed", sandbox_id=self.id)
        return await self.backend.transports.endpoint(self, self.backend.client, port)

    async def close(self) -> None:
        """Release the sandbox's object. The release runs to its end even if the caller
        is cancelled (else the claim, Sandbox or pod outlived a sandbox marked closed);
        a second close waits for the same release."""
        if self._release is None:
            self.closed = True
            for process in list(self.processes):
                process.abort()
            for sweep in list(self._sweeps):
                sweep.cancel()
            self._release = asyncio.ensure_future(self.backend.release(self))
        await asyncio.shield(self._release)
