"""Things the isolation tests set up on the host, so a sandbox can try to reach them:
secret files, a secret environment variable, a victim process, and listening sockets
that record whether anything reached them.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path


def new_secret() -> str:
    return f"rbx-secret-{uuid.uuid4().hex}"


@contextlib.contextmanager
def planted_files(paths: list[Path], secret: str) -> Iterator[list[Path]]:
    """Write ``secret`` into each path (readable only by us), remove them afterwards."""
    planted: list[Path] = []
    try:
        for path in paths:
            path.write_text(secret + "\n")
            path.chmod(0o600)
            planted.append(path)
        yield planted
    finally:
        for path in planted:
            path.unlink(missing_ok=True)


@dataclass
class HostProcess:
    """A long-sleeping host process with a secret in its environment and argv."""

    secret: str
    marker: str = field(default_factory=lambda: f"rbx-victim-{uuid.uuid4().hex}")
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> HostProcess:
        env = {**os.environ, "RBX_VICTIM_SECRET": self.secret}
        code = "import sys, time\nprint('ready', flush=True)\ntime.sleep(600)"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, self.marker], env=env, stdout=subprocess.PIPE
        )
        assert self.proc.stdout is not None
        self.proc.stdout.readline()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()


class Listener:
    """A host socket that reports whether anyone connected or sent to it."""

    def __init__(self, sock: socket.socket, address: str | tuple[str, int]) -> None:
        self.sock = sock
        self.address = address
        sock.setblocking(False)

    @classmethod
    def tcp(cls, host: str = "127.0.0.1") -> Listener:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, 0))
        sock.listen(16)
        return cls(sock, sock.getsockname())

    @classmethod
    def udp(cls, host: str = "127.0.0.1") -> Listener:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind((host, 0))
        return cls(sock, sock.getsockname())

    @classmethod
    def unix(cls, path: Path) -> Listener:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(path))
        path.chmod(0o777)
        sock.listen(16)
        return cls(sock, str(path))

    @classmethod
    def abstract(cls) -> Listener:
        """A Linux abstract-namespace socket; the address is returned without the NUL."""
        name = f"rbx-conformance-{uuid.uuid4().hex}"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind("\0" + name)
        sock.listen(16)
        return cls(sock, name)

    @property
    def port(self) -> int:
        assert isinstance(self.address, tuple)
        return self.address[1]

    def reached(self, wait_s: float = 0.3) -> bool:
        """True if a connection or datagram arrived."""
        deadline = time.monotonic() + wait_s
        poller = select.poll()  # not select(): fds above 1024 are common with many sandboxes
        poller.register(self.sock, select.POLLIN)
        while True:
            if poller.poll(50):
                return True
            if time.monotonic() >= deadline:
                return False

    def close(self) -> None:
        self.sock.close()


def host_ipv4() -> str | None:
    """This host's primary non-loopback IPv4 address, if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.254.254.254", 9))
            address = str(probe.getsockname()[0])
        except OSError:
            return None
    return None if address.startswith("127.") else address


def proc_file(pid: int, name: str) -> bytes:
    """The bytes of ``/proc/<pid>/<name>`` on the host."""
    return Path(f"/proc/{pid}/{name}").read_bytes()


def host_processes_with(marker: str) -> list[int]:
    """Host pids whose command line contains ``marker`` (ours excluded)."""
    found = []
    needle = marker.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline:
            found.append(int(entry.name))
    return found
