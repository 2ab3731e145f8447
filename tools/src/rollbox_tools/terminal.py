"""``rollbox run``'s work: one command in a fresh sandbox, wired to this terminal.

- stdin is the command's stdin: a pipe or file is passed through and closed at its end
  (so ``echo hi | rollbox run -- cat`` ends), ``< /dev/null`` is an immediate end, and a
  terminal is passed line by line until Ctrl-D or the command's exit, like ``ssh``.
- stdout and stderr are written as they arrive; past the cap (``--max-output``) the rest
  is dropped and a line on stderr says so, and a command that exited 0 exits
  ``EXIT_OUTPUT_CUT``: a script never takes cut output for the whole of it.
- A closed stdout (``rollbox run -- yes | head -1``) ends the command, as SIGPIPE would.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import BinaryIO, TextIO

from rollbox.backend import Backend
from rollbox.errors import CommandNotFoundError, ExecTimeoutError
from rollbox.sandbox import ExecResult, Process, Sandbox, check_command
from rollbox.spec import MiB, SandboxSpec

EXIT_TIMEOUT = 124  # as timeout(1)
EXIT_OUTPUT_CUT = 125  # the command exited 0, but its output was more than --max-output
EXIT_NOT_FOUND = 127  # as a shell
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE  # as a shell reports a command SIGPIPE killed
CHUNK = 65536


class _StdoutClosed(Exception):
    """Whoever reads our stdout went away."""


class _Output:
    """Our stdout or stderr, with the command's bytes capped at ``cap``."""

    def __init__(self, name: str, stream: BinaryIO, cap: int) -> None:
        self.name = name
        self.stream = stream
        self.room = cap
        self.cut = False

    def write(self, data: bytes) -> None:
        if len(data) > self.room:
            self.cut = True
            data = data[: self.room]
        self.room -= len(data)
        if not data:
            return
        try:
            self.stream.write(data)
            self.stream.flush()
        except BrokenPipeError:
            raise _StdoutClosed from None


async def run_command(backend_class: Callable[[], Backend], spec: SandboxSpec, argv: list[str],
                      cap: int) -> int:
    """Run ``argv`` in a fresh sandbox of ``spec``; returns the exit code for the shell."""
    check_command(argv, spec.env)  # a bad argv is refused before a sandbox is made
    outputs = {"stdout": _Output("stdout", _binary(sys.stdout), cap),
               "stderr": _Output("stderr", _binary(sys.stderr), cap)}
    async with backend_class() as backend:
        sandbox = await backend.create(spec)
        async with sandbox:
            try:
                if backend.capabilities.streaming:
                    code = await _stream(sandbox, argv, outputs, cap)
                else:
                    code = _write_result(await sandbox.exec(
                        argv, stdin=_all_stdin(), output_limit=cap + 1), outputs)
            except CommandNotFoundError as exc:
                print(f"rollbox: {exc.message}", file=sys.stderr)
                return EXIT_NOT_FOUND
            except ExecTimeoutError as exc:
                with contextlib.suppress(_StdoutClosed):
                    outputs["stdout"].write(exc.stdout)
                outputs["stderr"].write(exc.stderr)
                print(f"rollbox: timed out after {exc.timeout_s:g}s", file=sys.stderr)
                return EXIT_TIMEOUT
            except _StdoutClosed:
                _silence_stdout()
                return EXIT_BROKEN_PIPE
    cut = [o.name for o in outputs.values() if o.cut]
    if cut:
        print(f"rollbox: {' and '.join(cut)} cut at {cap / MiB:g} MiB: the command wrote "
              "more (raise --max-output to keep it)", file=sys.stderr)
    code = 128 - code if code < 0 else code
    return EXIT_OUTPUT_CUT if cut and code == 0 else code


async def _stream(sandbox: Sandbox, argv: list[str], outputs: dict[str, _Output],
                  cap: int) -> int:
    # One byte over the cap: receiving it is how we know the command wrote more.
    process = await sandbox.stream(argv, output_limit=cap + 1)
    feeder = asyncio.ensure_future(_feed_stdin(process))
    try:
        async for chunk in process:
            outputs[chunk.stream].write(chunk.data)
        return await process.wait()
    finally:
        feeder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await feeder


def _write_result(result: ExecResult, outputs: dict[str, _Output]) -> int:
    outputs["stdout"].write(result.stdout)
    outputs["stderr"].write(result.stderr)
    outputs["stdout"].cut |= result.stdout_truncated
    outputs["stderr"].cut |= result.stderr_truncated
    return result.exit_code


async def _feed_stdin(process: Process) -> None:
    """Our stdin to the command's, then its end (EOF)."""
    try:
        fd = sys.stdin.fileno() if sys.stdin is not None else None
    except (OSError, ValueError):
        fd = None
    try:
        if fd is not None:
            read = _reader(fd)
            while chunk := await read():
                await process.write_stdin(chunk)
    except OSError:  # the command closed its stdin, or ours cannot be read: stop feeding
        pass
    finally:
        with contextlib.suppress(OSError):
            await process.close_stdin()


def _reader(fd: int) -> Callable[[], Awaitable[bytes]]:
    """Reads of ``fd`` that never block the event loop: a pipe, socket or terminal is
    read when ready (it may stay quiet for ever); a regular file or /dev/null, which
    cannot be polled but never blocks for long, is read in a thread."""
    loop = asyncio.get_running_loop()
    try:
        loop.add_reader(fd, lambda: None)
        loop.remove_reader(fd)
    except (PermissionError, ValueError):  # epoll refuses regular files and /dev/null
        async def read_in_thread() -> bytes:
            return await asyncio.to_thread(os.read, fd, CHUNK)

        return read_in_thread

    async def read_when_ready() -> bytes:
        ready: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            if not ready.done():
                ready.set_result(None)

        loop.add_reader(fd, wake)
        try:
            await ready
        finally:
            loop.remove_reader(fd)
        return os.read(fd, CHUNK)  # ready: returns at once, even on a blocking terminal

    return read_when_ready


def _all_stdin() -> bytes | None:
    """All of stdin for a backend without streaming (None for a terminal: there is no
    way to pass what is typed later)."""
    if sys.stdin is None or sys.stdin.isatty():
        return None
    return sys.stdin.buffer.read()


def _binary(stream: TextIO | None) -> BinaryIO:
    """The byte stream under ``stream``; /dev/null when it was closed (``>&-``)."""
    if stream is None:
        return open(os.devnull, "wb")
    return stream.buffer


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's last flush cannot fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
