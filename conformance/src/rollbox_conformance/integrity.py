"""Reward integrity: a rollout can neither forge a later command's result nor dodge its
verdict by breaking its own sandbox.

In RL the reward comes from commands run after the policy's (a task's verdict). A policy
that can leave a process behind to tamper with them, or crash its sandbox whenever it is
failing so that the attempt is retried as an infrastructure fault, learns to do exactly
that. Each test here is such an attack, run from inside:

* ``seal``: after ``Sandbox.seal()`` nothing the workload started is alive (daemons that
  double-forked and left their session included), its files are still there, and the
  sandbox runs commands again;
* ``exec_isolation``: a process a command left running cannot trace a later command
  (``ptrace``, ``/proc/PID/mem``): it tries to rewrite the exit code of the verdict's
  ``exit 3`` as it reaches ``exit_group``;
* whatever a sandbox's processes do to rollbox's own processes inside (SIGINT to pid 1,
  stopping or killing every other process in a loop), a command's timeout holds and no
  call fails as a lost, retryable sandbox: an error they cause is a ``WorkloadError``
  or a timeout, both outcomes of the rollout, and a seal (or reset) ends the attack;
* a full disk is ENOSPC and exhausted memory kills a command, not the sandbox.
"""

from __future__ import annotations

import asyncio
import dataclasses
import platform
import uuid
from collections.abc import Awaitable
from typing import Any, TypeVar

import pytest
from rollbox import Backend, Sandbox
from rollbox.errors import ExecTimeoutError, RollboxError, WorkloadError

from rollbox_conformance.attacks import PYTHON_PRELUDE, PYTHON_RUNNER
from rollbox_conformance.base import BackendTestBase

T = TypeVar("T")

FORGER = """\
# Waits for a process whose command line holds MARKER, then tries to make its exit
# code 0: attach with ptrace and rewrite exit_group's argument, or write its memory.
import json, time
PTRACE_SYSCALL, PTRACE_GETREGS, PTRACE_SETREGS, PTRACE_DETACH = 24, 12, 13, 17
PTRACE_SEIZE, PTRACE_INTERRUPT, WALL = 0x4206, 0x4207, 0x40000000
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
libc.ptrace.restype = ctypes.c_long
if platform.machine() != "x86_64":
    sys.exit(77)
Regs = ctypes.c_ulonglong * 27  # struct user_regs_struct: rdi is 14, orig_rax 15
marker, log = sys.argv[1].encode(), sys.argv[2]
report = {"ready": True}
open(log, "w").write(json.dumps(report))
me, deadline = os.getpid(), time.monotonic() + 20
target = None
while target is None and time.monotonic() < deadline:
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != me:
            try:
                if marker in open(f"/proc/{name}/cmdline", "rb").read():
                    target = int(name)
                    break
            except OSError:
                pass
if target is not None:
    try:
        open(f"/proc/{target}/mem", "r+b").close()
        report["mem"] = "opened"
    except OSError as exc:
        report["mem"] = exc.errno
    if libc.ptrace(PTRACE_SEIZE, target, None, None) != 0:
        report["ptrace"] = ctypes.get_errno()
    else:
        report["ptrace"] = "attached"
        libc.ptrace(PTRACE_INTERRUPT, target, None, None)
        os.waitpid(target, WALL)
        regs = Regs()
        while time.monotonic() < deadline:
            libc.ptrace(PTRACE_SYSCALL, target, None, None)
            os.waitpid(target, WALL)
            libc.ptrace(PTRACE_GETREGS, target, None, ctypes.byref(regs))
            if regs[15] == 231:  # exit_group: make it exit 0
                regs[14] = 0
                libc.ptrace(PTRACE_SETREGS, target, None, ctypes.byref(regs))
                report["forged"] = True
                break
        libc.ptrace(PTRACE_DETACH, target, None, None)
open(log, "w").write(json.dumps(report))
"""

# Each loop first waits a moment, so that the command that started it has returned: the
# attack is on the commands after it.
STOP_EVERYTHING = """\
sleep 1
while :; do
  for p in /proc/[0-9]*; do p=${p#/proc/}; [ "$p" = $$ ] || kill -STOP "$p" 2>/dev/null; done
done
"""
"""A loop that keeps every other process of the sandbox stopped."""

KILL_EVERYTHING = """\
sleep 1
while :; do
  for p in /proc/[0-9]*; do p=${p#/proc/}; [ "$p" = $$ ] || kill -KILL "$p" 2>/dev/null; done
done
"""
"""A loop that keeps killing every other process of the sandbox."""


class IntegrityTests(BackendTestBase):
    """What a rollout does inside its sandbox cannot change its verdict or make its own
    failures look like the infrastructure's."""

    async def _never_lost(self, call: Awaitable[T]) -> T | RollboxError:
        """``call``'s result, or its error if it is one the workload may cause: an
        outcome (a timeout, a WorkloadError). Any other error fails the test."""
        try:
            return await call
        except (ExecTimeoutError, WorkloadError) as error:
            return error
        except RollboxError as error:
            pytest.fail(f"the workload's own attack surfaced as {type(error).__name__} "
                        f"(retryable={error.retryable}), as if the infrastructure failed: "
                        f"{error}")

    async def _background(self, sandbox: Sandbox, script: str, stdin: bytes | None = None,
                          *args: str) -> None:
        """Start ``script`` (sh, or python3 with ``stdin``) detached from its command."""
        path = self.scratch("bg")
        if stdin is not None:
            await sandbox.write_file(path, stdin)
            command = "python3 " + path + "".join(f" '{a}'" for a in args)
        else:
            await sandbox.write_file(path, script.encode())
            command = "sh " + path
        await self.sh(sandbox, f"nohup setsid {command} > /dev/null 2>&1 < /dev/null &")

    # -- seal ------------------------------------------------------------------------------

    async def test_seal_ends_every_process_and_keeps_the_files(self, backend: Backend) -> None:
        self.require(backend, "seal", "shell")
        beat, kept = self.scratch("beat"), self.scratch("kept")
        async with await backend.create(self.spec) as sandbox:
            await sandbox.write_file(kept, b"the rollout's work")
            daemon = f"(setsid sh -c 'while :; do date +%s%N >> {beat}; sleep 0.05; done' &)"
            await self.sh(sandbox, f"{daemon} > /dev/null 2>&1; sleep 30 > /dev/null 2>&1 &")
            running = None
            if backend.capabilities.streaming:
                running = await sandbox.stream(["sh", "-c", "sleep 60"], timeout=120)
            await asyncio.sleep(0.3)
            async with self.within(30, "seal"):
                await sandbox.seal()
            if running is not None:
                async with self.within(30, "the command running during the seal"):
                    code = await running.wait()
                assert code != 0, "a command running during the seal went on to succeed"
            before = await sandbox.read_file(beat)
            await asyncio.sleep(0.4)
            assert await sandbox.read_file(beat) == before, "the daemon lived on past the seal"
            assert await sandbox.read_file(kept) == b"the rollout's work"
            alive = await self.sh(sandbox, "for p in /proc/[0-9]*; do "
                                  "cat $p/cmdline 2>/dev/null | tr '\\0' ' '; echo; done")
            assert "sleep" not in alive.text, f"processes outlived the seal: {alive.text}"
            assert (await self.sh(sandbox, "echo works")).text == "works\n"
            await sandbox.seal()  # again, with nothing to end
            assert (await self.sh(sandbox, "echo again")).text == "again\n"

    # -- exec isolation ---------------------------------------------------------------------

    async def test_a_process_left_running_cannot_forge_a_later_command(
            self, backend: Backend) -> None:
        """The attack of the issue that made this a capability: a background process
        waits for the verifier's command and rewrites its ``exit 3`` into ``exit 0``."""
        self.require(backend, "exec_isolation", "shell")
        if platform.machine() != "x86_64":
            pytest.skip("the forger speaks x86_64's registers")
        marker, log = f"VERDICT-{uuid.uuid4().hex[:12]}", self.scratch("forger")
        async with await backend.create(self.spec) as sandbox:
            probe = await self.sh(sandbox, "command -v python3 >/dev/null || exit 77")
            if probe.exit_code == 77:
                pytest.skip("the image has no python3")
            await self._background(sandbox, "", (PYTHON_PRELUDE + FORGER).encode(), marker, log)
            for _ in range(100):
                if (await self.sh(sandbox, f"cat {log} 2>/dev/null")).text:
                    break
                await asyncio.sleep(0.05)
            verdict = await self.sh(sandbox, f"sleep 1; : {marker}; exit 3")
            await asyncio.sleep(0.3)
            report = (await self.sh(sandbox, f"cat {log}")).text
        assert verdict.exit_code == 3, f"a background process forged the result: {report}"
        assert '"ptrace": "attached"' not in report, f"it could trace the command: {report}"
        assert '"mem": "opened"' not in report, f"it could open the command's memory: {report}"

    # -- what the workload does to rollbox's processes ----------------------------------------

    async def test_interrupting_pid_1_leaves_the_sandbox_serving(self, backend: Backend) -> None:
        self.require(backend, "shell")
        async with await backend.create(self.spec) as sandbox:
            for signal in ("INT", "TERM", "HUP", "QUIT", "USR1", "KILL", "STOP"):
                await self._never_lost(self.sh(sandbox, f"kill -{signal} 1 2>/dev/null; true"))
            assert (await self.sh(sandbox, "echo serving")).text == "serving\n"

    async def test_stopping_every_process_cannot_stretch_a_timeout(
            self, backend: Backend) -> None:
        """A loop stops every other process of the sandbox, rollbox's own included: a
        command's timeout still holds (a file request's too: ``timeouts.exec_s``), and
        nothing fails as a lost sandbox."""
        self.require(backend, "shell")
        spec = self.spec.replace(timeouts=dataclasses.replace(self.spec.timeouts, exec_s=3.0))
        async with await backend.create(spec) as sandbox:
            await self._background(sandbox, STOP_EVERYTHING)
            await asyncio.sleep(1.3)
            for _ in range(3):
                async with self.within(2.0 + self.timeout_slack_s, "a command under the loop"):
                    await self._never_lost(sandbox.exec("sleep 5", timeout=2.0))
            async with self.within(3.0 + self.timeout_slack_s, "a file request under the loop"):
                await self._never_lost(sandbox.write_file(self.scratch("f"), b"x"))
            await self._settle(backend, sandbox)

    async def test_killing_every_process_is_the_workloads_doing(self, backend: Backend) -> None:
        """A loop keeps killing every other process of the sandbox: what fails because
        of it is a WorkloadError or an outcome, never a retryable sandbox failure."""
        self.require(backend, "shell")
        async with await backend.create(self.spec) as sandbox:
            await self._background(sandbox, KILL_EVERYTHING)
            await asyncio.sleep(1.3)
            for _ in range(5):
                await self._never_lost(self.sh(sandbox, "echo still here", timeout=5))
                await self._never_lost(sandbox.write_file(self.scratch("f"), b"x"))
                await self._never_lost(sandbox.read_file("/etc/hostname"))
            await self._settle(backend, sandbox)

    async def _settle(self, backend: Backend, sandbox: Sandbox) -> None:
        """End the attack (a seal, or a reset) and check the sandbox serves again, unless
        the seal said the workload kept it from ending (a WorkloadError: a backend with
        no process inside that the workload cannot stop, a pod, may lose that race)."""
        if backend.capabilities.seal:
            if isinstance(await self._never_lost(sandbox.seal()), WorkloadError):
                return
        else:
            await sandbox.reset()
        result = await self._never_lost(self.sh(sandbox, "echo settled", timeout=10))
        assert not isinstance(result, RollboxError) and result.text == "settled\n", result

    # -- the sandbox's own limits -------------------------------------------------------------

    async def test_a_full_disk_is_enospc_and_the_sandbox_goes_on(self, backend: Backend) -> None:
        self.require(backend, "shell", "disk_limit")
        spec = self.spec.replace(resources=dataclasses.replace(self.spec.resources,
                                                       disk_mb=32))
        fill = self.scratch("fill")
        async with await backend.create(spec) as sandbox:
            full = await self._never_lost(self.sh(
                sandbox, f"head -c 67108864 /dev/zero > {fill}; echo rc=$?", timeout=60))
            assert not isinstance(full, RollboxError), full
            assert "rc=0" not in full.text and b"space" in full.stderr.lower(), full
            await self.sh(sandbox, f"rm -f {fill}")
            assert (await self.sh(sandbox, "echo room")).text == "room\n"

    async def test_exhausted_memory_kills_a_command_not_the_sandbox(
            self, backend: Backend) -> None:
        """Processes and a memfd past memory_mb: the command dies (or fails), the
        sandbox runs the next one; a sandbox it cannot keep is a WorkloadError."""
        self.require(backend, "shell", "memory_limit")
        small: dict[str, Any] = {"memory_mb": 96}
        if backend.capabilities.disk_limit:
            small["disk_mb"] = 16
        spec = self.spec.replace(resources=dataclasses.replace(self.spec.resources, **small))
        hogs = [
            "x = bytearray(1 << 30)\nprint('held', flush=True)",
            "f = os.memfd_create('hog')\n"
            "for _ in range(1024): os.write(f, b'\\1' * (1 << 20))\nprint('held', flush=True)",
        ]
        async with await backend.create(spec) as sandbox:
            for hog in hogs:
                result = await self._never_lost(self.sh(
                    sandbox, PYTHON_RUNNER, timeout=60, stdin=(PYTHON_PRELUDE + hog).encode()))
                if isinstance(result, WorkloadError):
                    return  # it could not keep the sandbox, and said whose doing that was
                assert not isinstance(result, RollboxError), result
                if result.exit_code == 77:
                    pytest.skip("the image has no python3")
                assert "held" not in result.text, f"1 GiB was held under memory_mb=96: {hog}"
                assert (await self.sh(sandbox, "echo next")).text == "next\n"

    async def test_files_in_memory_past_memory_mb_never_lose_the_sandbox(
            self, backend: Backend) -> None:
        """The attack of the issue: ``/dev/shm`` filled past ``memory_mb`` (default
        ``disk_mb``). A full disk, a killed writer or a WorkloadError are outcomes; an
        out-of-memory kill of rollbox's agent surfacing as a lost sandbox is not."""
        self.require(backend, "shell", "memory_limit")
        spec = self.spec.replace(resources=dataclasses.replace(self.spec.resources,
                                                               memory_mb=64))
        async with await backend.create(spec) as sandbox:
            fill = "[ -d /dev/shm ] || exit 77; head -c 201326592 /dev/zero > /dev/shm/rbx-fill"
            result = await self._never_lost(self.sh(sandbox, fill, timeout=60))
            if not isinstance(result, RollboxError) and result.exit_code == 77:
                pytest.skip("the sandbox has no /dev/shm")
            if not isinstance(result, WorkloadError):
                after = await self._never_lost(self.sh(sandbox, "rm -f /dev/shm/rbx-fill; "
                                                                "echo next"))
                assert isinstance(after, WorkloadError) or (
                    not isinstance(after, RollboxError) and after.text == "next\n"), after
