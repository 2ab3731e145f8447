"""Isolation: escape attempts that must all fail. Host files, the host's environment
and processes, the network, privileges, devices and kernel interfaces stay out of reach.

Each test plants something on the host (a secret file, a secret environment variable,
a victim process, a listening socket), tries to reach it from inside, and checks both
what the sandbox saw and what the host saw.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from rollbox import Backend, ExecResult, Network, Sandbox
from rollbox.errors import PathOutsideSandboxError, RollboxError, SandboxFileNotFoundError

from rollbox_conformance.attacks import ATTACKS, PYTHON_PRELUDE, PYTHON_RUNNER, Attack
from rollbox_conformance.base import BackendTestBase
from rollbox_conformance.hostside import (
    HostProcess,
    Listener,
    host_ipv4,
    new_secret,
    planted_files,
    proc_file,
)
from rollbox_conformance.swaps import Swap

SECRET_ENV = "RBX_CONFORMANCE_HOST_SECRET"


def _absent(needle: str) -> str:
    """A grep pattern for ``needle`` that does not match its own command line."""
    return f"[{needle[0]}]{needle[1:]}"


class IsolationTests(BackendTestBase):
    """At least thirty escape attempts; each must fail inside the sandbox."""

    # -- fixtures --------------------------------------------------------------------------

    @pytest.fixture
    def host_env_secret(self, monkeypatch: pytest.MonkeyPatch) -> str:
        """A secret in this process's environment, set before the backend starts."""
        secret = new_secret()
        monkeypatch.setenv(SECRET_ENV, secret)
        return secret

    @pytest.fixture
    def planted(self, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[
        tuple[str, list[Path]]
    ]:
        secret = new_secret()
        paths = self.host_secret_paths(tmp_path, request.config.rootpath)
        with planted_files(paths, secret) as written:
            yield secret, written

    @pytest.fixture
    def victim(self) -> Iterator[HostProcess]:
        process = HostProcess(new_secret()).start()
        try:
            yield process
        finally:
            process.stop()

    @pytest_asyncio.fixture
    async def isolated(self, backend: Backend) -> AsyncIterator[Sandbox]:
        """A sandbox of ``spec``, for backends that declare isolation and a shell."""
        self.require(backend, "isolation", "shell")
        sandbox = await backend.create(self.spec)
        try:
            yield sandbox
        finally:
            await sandbox.close()

    @pytest_asyncio.fixture
    async def swap(self, isolated: Sandbox, planted: tuple[str, list[Path]]) -> AsyncIterator[
        Swap
    ]:
        """A swap loop running in ``isolated``, pointing at the first planted secret."""
        secret, paths = planted
        assert paths, "no host path could be planted with a secret"
        swap = Swap(self.scratch("swap"), paths[0], secret.encode())
        try:
            result = await self.python(isolated, swap.script())
            if result.exit_code == 77:
                pytest.skip("no python3, or no atomic exchange of names (renameat2): "
                            f"{result.text.strip()}")
            assert result.text == "swapping\n", result
            yield swap
        finally:
            swap.clean_host()

    # -- helpers -----------------------------------------------------------------------------

    async def attempt(self, sandbox: Sandbox, attack: Attack) -> ExecResult:
        command, stdin = attack.command()
        return await self.sh(sandbox, command, stdin=stdin, timeout=30)

    async def python(self, sandbox: Sandbox, code: str) -> ExecResult:
        return await self.sh(sandbox, PYTHON_RUNNER, stdin=(PYTHON_PRELUDE + code).encode())

    @staticmethod
    def assert_blocked(result: ExecResult, what: str) -> None:
        if result.exit_code == 77:
            pytest.skip(f"the image lacks what this attempt needs: {what}")
        assert result.exit_code != 0, (
            f"escape succeeded: {what}\nstdout={result.stdout[-2000:]!r}\n"
            f"stderr={result.stderr[-2000:]!r}"
        )

    def require_no_network(self) -> None:
        if self.spec.network is not Network.NONE:
            pytest.skip("the spec allows network access")

    # -- privileged operations, devices, kernel interfaces ------------------------------------

    @pytest.mark.parametrize("attack", ATTACKS, ids=[a.id for a in ATTACKS])
    async def test_attack_is_blocked(self, isolated: Sandbox, attack: Attack) -> None:
        if attack.network:
            self.require_no_network()
        self.assert_blocked(await self.attempt(isolated, attack), attack.what)

    # -- the host's environment ------------------------------------------------------------

    async def test_host_env_is_not_inherited(
        self, host_env_secret: str, backend: Backend
    ) -> None:
        self.require(backend, "isolation")
        async with await backend.create(self.spec) as sandbox:
            result = await sandbox.exec(["env"], timeout=30)
        assert host_env_secret not in result.text, "the host's environment leaked in"
        assert SECRET_ENV not in result.text

    async def test_host_env_not_in_any_proc_environ(
        self, host_env_secret: str, backend: Backend
    ) -> None:
        self.require(backend, "isolation", "shell")
        async with await backend.create(self.spec) as sandbox:
            result = await self.sh(
                sandbox, "cat /proc/self/environ /proc/1/environ /proc/[0-9]*/environ "
                f"2>/dev/null | tr '\\0' '\\n' | grep -c '{_absent(host_env_secret)}'"
            )
        assert result.text.strip() == "0", "the host's environment is visible in /proc"

    # -- host files --------------------------------------------------------------------------

    async def test_host_secret_files_are_unreadable(
        self, isolated: Sandbox, planted: tuple[str, list[Path]]
    ) -> None:
        secret, paths = planted
        assert paths, "no host path could be planted with a secret"
        for path in paths:
            result = await self.sh(
                isolated, f"cat '{path}' '/proc/1/root{path}' '/proc/self/root{path}' 2>&1"
            )
            assert secret not in result.text, f"read the host file {path} from inside"

    async def test_host_secret_is_not_found_by_searching(
        self, isolated: Sandbox, planted: tuple[str, list[Path]]
    ) -> None:
        secret, paths = planted
        dirs = sorted({str(p.parent) for p in paths} | {
            "/tmp", "/var/tmp", "/root", "/home", "/run", "/mnt", "/srv", "/opt", "/dev/shm"})
        result = await self.sh(
            isolated, f"grep -rlsF -- '{secret}' {' '.join(dirs)}; echo searched", timeout=60
        )
        assert result.text.endswith("searched\n")
        assert result.text == "searched\n", f"found host secrets: {result.text!r}"

    async def test_host_files_unreachable_through_the_api(
        self, backend: Backend, planted: tuple[str, list[Path]]
    ) -> None:
        self.require(backend, "isolation")
        secret, paths = planted
        async with await backend.create(self.spec) as sandbox:
            for path in paths:
                try:
                    data = await sandbox.read_file(str(path))
                except (PathOutsideSandboxError, SandboxFileNotFoundError):
                    continue
                assert secret.encode() not in data, f"read_file reached the host's {path}"

    async def test_file_api_under_a_symlink_swap_loop(self, isolated: Sandbox,
                                                      swap: Swap) -> None:
        """read_file/write_file on names the sandbox keeps swapping between its own
        directory and a symlink to the host: refused or inside, never the host's."""
        async with self.within(120 + self.timeout_slack_s, "file calls under a swap loop"):
            for _ in range(10):
                reads = [isolated.read_file(path) for path in swap.reads * 2]
                writes = [isolated.write_file(path, b"from the api") for path in swap.writes]
                results: list[object] = await asyncio.gather(*reads, *writes,
                                                             return_exceptions=True)
                for result in results:
                    if isinstance(result, BaseException) and not isinstance(
                            result, RollboxError):
                        raise result
                    assert not (isinstance(result, bytes) and swap.secret in result), (
                        "read_file returned the host's secret")
        assert swap.host_problems() == []

    async def test_snapshots_under_a_symlink_swap_loop(self, backend: Backend,
                                                       isolated: Sandbox, swap: Swap) -> None:
        """Snapshots taken while the sandbox swaps names hold no host file, and taking
        them changes none (a fork of each is searched)."""
        self.require(backend, "snapshot", "fork")
        taken = 0
        async with self.within(180 + self.timeout_slack_s, "snapshots under a swap loop"):
            for _ in range(6):
                try:
                    snapshot = await isolated.snapshot()
                except RollboxError:
                    continue  # refusing is fine; copying the host's files is not
                taken += 1
                try:
                    async with await backend.fork(snapshot) as child:
                        found = await self.sh(child, f"grep -rlsF -- '{swap.secret.decode()}' "
                                                     f"{swap.base}; echo searched")
                        assert found.text == "searched\n", f"a fork holds the secret: {found}"
                        for path in swap.reads:
                            try:
                                data = await child.read_file(path)
                            except RollboxError:
                                continue
                            assert swap.secret not in data, f"a fork's {path} is the secret"
                finally:
                    await backend.drop_snapshot(snapshot)
        assert taken, "no snapshot of a sandbox running a swap loop succeeded"
        assert swap.host_problems() == []

    # -- host processes ----------------------------------------------------------------------

    async def test_host_processes_are_invisible(
        self, isolated: Sandbox, victim: HostProcess
    ) -> None:
        script = (
            f"cat /proc/{victim.pid}/cmdline /proc/{victim.pid}/environ 2>/dev/null "
            "| tr '\\0' '\\n'; echo\n"
            "for p in /proc/[0-9]*; do cat $p/cmdline $p/environ 2>/dev/null; echo; done "
            f"| tr '\\0' '\\n' | grep -c -e '{_absent(victim.marker)}' "
            f"-e '{_absent(victim.secret)}'"
        )
        result = await self.sh(isolated, script)
        assert victim.marker not in result.text, "a host process's command line is visible"
        assert victim.secret not in result.text, "a host process's environment is visible"
        assert result.text.strip().splitlines()[-1] == "0"

    async def test_test_runner_is_invisible(self, isolated: Sandbox) -> None:
        mine = proc_file(os.getpid(), "cmdline")
        result = await self.sh(isolated, f"cat /proc/{os.getpid()}/cmdline 2>/dev/null; true")
        assert result.stdout != mine, "the test runner's /proc entry is visible"

    @pytest.mark.parametrize("signal_name", ["KILL", "TERM", "STOP"])
    async def test_host_process_cannot_be_signalled(
        self, isolated: Sandbox, victim: HostProcess, signal_name: str
    ) -> None:
        await self.sh(isolated, f"kill -{signal_name} {victim.pid} 2>/dev/null; true")
        assert victim.alive(), f"SIG{signal_name} from the sandbox killed a host process"
        state = proc_file(victim.pid, "stat").rsplit(b")", 1)[1].split()[0]
        assert state != b"T", "SIGSTOP from the sandbox stopped a host process"

    async def test_host_process_cannot_be_ptraced(
        self, isolated: Sandbox, victim: HostProcess
    ) -> None:
        code = (
            f"pid = {victim.pid}\n"
            "try:\n"
            "    if b'" + victim.marker + "' not in open(f'/proc/{pid}/cmdline', 'rb').read():\n"
            "        sys.exit(1)\n"
            "except OSError:\n    sys.exit(1)\n"
            "libc.ptrace.restype = ctypes.c_long\n"
            "if libc.ptrace(16, pid, None, None) == 0:\n"  # PTRACE_ATTACH
            "    os.waitpid(pid, 0); libc.ptrace(17, pid, None, None); sys.exit(0)\n"
            "try:\n"
            "    start = int(open(f'/proc/{pid}/maps').readline().split('-')[0], 16)\n"
            "    with open(f'/proc/{pid}/mem', 'rb') as mem:\n"
            "        mem.seek(start); mem.read(16)\n"
            "    sys.exit(0)\n"
            "except (OSError, ValueError):\n    sys.exit(1)\n"
        )
        self.assert_blocked(await self.python(isolated, code), "ptrace a host process")
        assert victim.alive()

    # -- what a command inherits ----------------------------------------------------------

    async def test_commands_start_with_only_stdin_stdout_and_stderr(
        self, isolated: Sandbox
    ) -> None:
        """No descriptor of the backend's (a control socket, a pipe, a log) reaches a
        command: a process holding one could forge later results or reach the host."""
        result = await self.sh(isolated, "[ -d /proc/$$/fd ] || exit 77\n"
                                         "command -v ls >/dev/null || exit 77\n"
                                         "ls /proc/$$/fd")
        if result.exit_code == 77:
            pytest.skip("the sandbox has no /proc/<pid>/fd or no ls to list it")
        assert result.exit_code == 0, result
        fds = sorted(result.text.split(), key=lambda fd: int(fd) if fd.isdigit() else -1)
        assert fds == ["0", "1", "2"], f"a command started with descriptors {fds}"

    # -- the network ----------------------------------------------------------------------

    CONNECT = (
        "s = socket.socket(socket.{family}, socket.{kind}); s.settimeout(3)\n"
        "try:\n    s.connect({address!r})\n    s.sendall(b'rbx')\n"
        "except OSError:\n    sys.exit(1)\nsys.exit(0)\n"
    )

    async def _reach(self, sandbox: Sandbox, listener: Listener, family: str, kind: str,
                     address: object, what: str) -> None:
        code = self.CONNECT.format(family=family, kind=kind, address=address)
        result = await self.python(sandbox, code)
        reached = listener.reached()
        if result.exit_code == 77:
            pytest.skip("the image has no python3 to try the connection with")
        assert not reached, f"{what}: the host listener was reached from inside"
        if kind == "SOCK_STREAM":
            self.assert_blocked(result, what)

    async def test_tcp_to_host_loopback(self, isolated: Sandbox) -> None:
        self.require_no_network()
        listener = Listener.tcp("127.0.0.1")
        try:
            await self._reach(isolated, listener, "AF_INET", "SOCK_STREAM",
                              ("127.0.0.1", listener.port), "TCP to the host's 127.0.0.1")
        finally:
            listener.close()

    async def test_tcp_to_host_address(self, isolated: Sandbox) -> None:
        self.require_no_network()
        address = host_ipv4()
        if address is None:
            pytest.skip("this host has no non-loopback IPv4 address")
        listener = Listener.tcp("0.0.0.0")
        try:
            await self._reach(isolated, listener, "AF_INET", "SOCK_STREAM",
                              (address, listener.port), f"TCP to the host's {address}")
        finally:
            listener.close()

    async def test_udp_to_host_loopback(self, isolated: Sandbox) -> None:
        self.require_no_network()
        listener = Listener.udp("127.0.0.1")
        try:
            await self._reach(isolated, listener, "AF_INET", "SOCK_DGRAM",
                              ("127.0.0.1", listener.port), "UDP to the host's 127.0.0.1")
        finally:
            listener.close()

    async def test_host_unix_socket(self, isolated: Sandbox, tmp_path: Path) -> None:
        listener = Listener.unix(tmp_path / "host.sock")
        try:
            await self._reach(isolated, listener, "AF_UNIX", "SOCK_STREAM",
                              str(listener.address), "a host unix socket")
        finally:
            listener.close()

    async def test_host_abstract_unix_socket(self, isolated: Sandbox) -> None:
        listener = Listener.abstract()
        try:
            await self._reach(isolated, listener, "AF_UNIX", "SOCK_STREAM",
                              "\0" + str(listener.address), "a host abstract unix socket")
        finally:
            listener.close()

    async def test_host_listeners_are_not_listed(self, isolated: Sandbox) -> None:
        listener = Listener.tcp("127.0.0.1")
        try:
            result = await self.sh(isolated, "cat /proc/net/tcp /proc/net/tcp6 2>/dev/null; true")
        finally:
            listener.close()
        local_ports = {line.split()[1].rsplit(":", 1)[-1] for line in
                       result.text.splitlines()[1:] if len(line.split()) > 2}
        assert f"{listener.port:04X}" not in local_ports, "the host's sockets are listed"

    # -- other sandboxes -------------------------------------------------------------------

    async def test_sandboxes_do_not_share_files(self, backend: Backend) -> None:
        self.require(backend, "isolation")
        path = f"/tmp/rbx-cross-{uuid.uuid4().hex}"
        async with await backend.create(self.spec) as first, \
                await backend.create(self.spec) as second:
            await first.write_file(path, b"first's")
            with pytest.raises(SandboxFileNotFoundError):
                await second.read_file(path)

    async def test_sandboxes_do_not_see_each_others_processes(self, backend: Backend) -> None:
        self.require(backend, "isolation", "shell")
        marker = f"rbx-neighbour-{uuid.uuid4().hex}"
        async with await backend.create(self.spec) as first, \
                await backend.create(self.spec) as second:
            started = await self.sh(
                first, f"sh -c 'sleep 60; :' {marker} </dev/null >/dev/null 2>&1 & "
                "sleep 0.3; echo started")
            assert started.text == "started\n"
            result = await self.sh(
                second, "for p in /proc/[0-9]*; do cat $p/cmdline 2>/dev/null; echo; done "
                f"| tr '\\0' ' ' | grep -c '{_absent(marker)}'")
        assert result.text.strip() == "0", "a sandbox sees its neighbour's processes"
