"""The server's files: its pid file, default socket and token, and what a server
killed with SIGKILL left behind, cleaned at the next start.

    $ROLLBOX_HOME/serve/      0700
        serve.pid             {"pid", "started", "listen", "socket", "token_file", "generated"}
        serve.sock            the default unix socket (0600)
        token                 the generated token (0600), removed at shutdown
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from rollbox.errors import UsageError


@dataclass
class Claim:
    """A state directory claimed by this process, and what to remove at shutdown."""

    directory: Path
    token: str
    token_file: Path | None
    generated: bool
    socket: Path | None

    def release(self) -> None:
        """Remove the pid file, the socket and a generated token file."""
        for path in (self.socket, self.token_file if self.generated else None,
                     self.directory / "serve.pid"):
            if path is not None:
                with contextlib.suppress(OSError):
                    path.unlink()


def claim(directory: Path, *, socket: Path | None, token_file: Path | None,
          token: str | None) -> Claim:
    """Take ``directory`` for this server: refuse if a live server has it, clean what a
    dead one left, then settle the token (given, read from ``token_file``, or generated
    and written there 0600) and write the pid file."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    pid_file = directory / "serve.pid"
    previous = _read(pid_file)
    if previous is not None:
        pid = previous.get("pid")
        if isinstance(pid, int) and _alive(pid, previous.get("started")):
            raise UsageError(
                f"a rollbox server (pid {pid}) already runs with the state directory "
                f"{directory}, listening on {previous.get('listen')}; stop it, or give this "
                "one another --state-dir")
        _clean(previous)
        with contextlib.suppress(OSError):
            pid_file.unlink()
    if socket is not None:
        _clear_socket(socket)
    generated = False
    if token is None and token_file is not None and token_file.exists():
        token = _read_token(token_file)
    if token is None:
        token = secrets.token_urlsafe(32)
        if token_file is not None:
            _write_private(token_file, token + "\n")
            generated = True
    record = {"pid": os.getpid(), "started": _start_time(os.getpid()),
              "socket": str(socket) if socket else None,
              "token_file": str(token_file) if token_file else None, "generated": generated}
    _write_private(pid_file, json.dumps(record))
    return Claim(directory, token, token_file, generated, socket)


def record_listen(claim: Claim, listen: str) -> None:
    pid_file = claim.directory / "serve.pid"
    record = _read(pid_file) or {}
    record["listen"] = listen
    _write_private(pid_file, json.dumps(record))


def _read(pid_file: Path) -> dict[str, object] | None:
    try:
        data = json.loads(pid_file.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _alive(pid: int, started: object) -> bool:
    """A process ``pid`` runs and is the one that wrote the record (not a reused pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    fields = _stat(pid)
    if fields is not None and fields[0] == "Z":  # killed, not yet reaped: it serves nothing
        return False
    return started is None or (fields is not None and int(fields[19]) == started)


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _start_time(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[19]) if fields is not None else None


def _clean(previous: dict[str, object]) -> None:
    """What a killed server left: its socket, its generated token."""
    leftovers = [previous.get("socket")]
    if previous.get("generated"):
        leftovers.append(previous.get("token_file"))
    for path in leftovers:
        if isinstance(path, str):
            with contextlib.suppress(OSError):
                if Path(path).is_socket() or not Path(path).is_dir():
                    Path(path).unlink()


def _clear_socket(path: Path) -> None:
    if len(str(path).encode()) > 107:
        raise UsageError(f"the socket path {path} is too long for a unix socket (107 bytes "
                         "at most); choose a shorter --listen unix:PATH")
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise UsageError(f"{path} exists and is not a socket; choose another --listen path")
    import socket

    probe = socket.socket(socket.AF_UNIX)
    try:
        probe.connect(str(path))
    except OSError:
        path.unlink()  # nobody answers: a dead server's socket
        return
    finally:
        probe.close()
    raise UsageError(f"another server already listens on {path}")


def _read_token(path: Path) -> str:
    info = path.stat()
    if info.st_mode & 0o077:
        raise UsageError(f"the token file {path} is readable by others (mode "
                         f"{info.st_mode & 0o777:o}); chmod 600 {path}")
    token = path.read_text().strip()
    if len(token) < 16:
        raise UsageError(f"the token in {path} is shorter than 16 characters")
    return token


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` as a 0600 file, atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(partial, path)
