"""TCP out of a sandbox without network, over a streamed command's stdio.

An agent-server in a sandbox with ``network="none"`` has only its own loopback; it
needs to reach its LLM. ``Egress`` runs one program in the sandbox that listens on
127.0.0.1:PORT inside (the LLM's port, say) and multiplexes every connection made to it
over its stdio (``Sandbox.stream``, so the sandbox gains no network); the host opens a
connection to the target it was given for each. Only those targets are reachable,
nothing else. (The way in is the backend's port exposure, ``Sandbox.endpoint``.)

The in-sandbox program needs a ``python3`` in the image (every agent-server image has
one). Frames on its stdio: ``!IBI`` (connection id, kind, length) + payload; kinds OPEN
(sandbox to host), DATA, EOF (half-close), CLOSE.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct

from rollbox.errors import RollboxError
from rollbox.sandbox import Process, Sandbox

FOREVER_S = 365 * 24 * 3600.0
NO_CAP = 2**62
PYTHON = "python3"

_MUX = r"""
import itertools, os, socket, struct, sys, threading
H = struct.Struct("!IBI")
OPEN, DATA, EOF, CLOSE = range(4)
lock = threading.Lock()
conns = {}
def send(cid, kind, data=b""):
    frame = H.pack(cid, kind, len(data)) + data
    with lock:
        v = memoryview(frame)
        while v:
            v = v[os.write(1, v):]
done = {}
def finish(cid, c):
    with lock:
        done[cid] = done.get(cid, 0) + 1
        last = done[cid] == 2
    if last:
        conns.pop(cid, None)
        done.pop(cid, None)
        c.close()
def pump(cid, c):
    try:
        while True:
            d = c.recv(65536)
            if not d:
                break
            send(cid, DATA, d)
        send(cid, EOF)
    except OSError:
        send(cid, CLOSE)
    finish(cid, c)
ids = itertools.count(1)
def accept(srv, port):
    while True:
        c, _ = srv.accept()
        n = next(ids)
        conns[n] = c
        send(n, OPEN, port.encode())
        threading.Thread(target=pump, args=(n, c), daemon=True).start()
for port in sys.argv[1:]:
    srv = socket.create_server(("127.0.0.1", int(port)))
    threading.Thread(target=accept, args=(srv, port), daemon=True).start()
    send(0, OPEN, port.encode())
buf = b""
def read(n):
    global buf
    while len(buf) < n:
        d = os.read(0, 65536)
        if not d:
            os._exit(0)
        buf += d
    out, buf = buf[:n], buf[n:]
    return out
while True:
    cid, kind, size = H.unpack(read(H.size))
    data = read(size) if size else b""
    c = conns.get(cid)
    if c is None:
        continue
    try:
        if kind == DATA:
            c.sendall(data)
        elif kind == EOF:
            c.shutdown(socket.SHUT_WR)
            finish(cid, c)
        elif kind == CLOSE:
            conns.pop(cid, None)
            c.close()
    except OSError:
        conns.pop(cid, None)
        c.close()
"""

_HEADER = struct.Struct("!IBI")
_OPEN, _DATA, _EOF, _CLOSE = range(4)


class Egress:
    """``ports`` inside ``sandbox`` (127.0.0.1) lead to ``targets[port]`` = (host, port)
    on the host's side, and nowhere else."""

    def __init__(self, sandbox: Sandbox, targets: dict[int, tuple[str, int]]) -> None:
        self.sandbox = sandbox
        self.targets = dict(targets)
        self._process: Process | None = None
        self._task: asyncio.Task[None] | None = None
        self._queues: dict[int, asyncio.Queue[tuple[int, bytes]]] = {}
        self._pumps: set[asyncio.Task[None]] = set()
        self._send_lock = asyncio.Lock()
        self._listening: asyncio.Event = asyncio.Event()
        self._ports_seen = 0

    async def start(self) -> None:
        """Start the in-sandbox listener; returns once every port listens."""
        self._process = await self.sandbox.stream(
            [PYTHON, "-I", "-S", "-c", _MUX, *map(str, self.targets)], timeout=FOREVER_S,
            output_limit=NO_CAP)
        self._task = asyncio.create_task(self._read())
        await asyncio.wait_for(self._listening.wait(), 30)

    async def close(self) -> None:
        if self._process is not None:
            with contextlib.suppress(RollboxError, OSError):
                await self._process.send_signal(9)
        for task in [*self._pumps, *([self._task] if self._task else [])]:
            task.cancel()
        await asyncio.gather(*self._pumps, *([self._task] if self._task else []),
                             return_exceptions=True)

    async def _send(self, cid: int, kind: int, data: bytes = b"") -> None:
        assert self._process is not None
        async with self._send_lock:
            await self._process.write_stdin(_HEADER.pack(cid, kind, len(data)) + data)

    async def _read(self) -> None:
        assert self._process is not None
        buffer = b""
        async for chunk in self._process:
            if chunk.stream != "stdout":
                continue
            buffer += chunk.data
            while len(buffer) >= _HEADER.size:
                cid, kind, size = _HEADER.unpack_from(buffer)
                if len(buffer) < _HEADER.size + size:
                    break
                data = buffer[_HEADER.size:_HEADER.size + size]
                buffer = buffer[_HEADER.size + size:]
                if cid == 0:  # a port listens
                    self._ports_seen += 1
                    if self._ports_seen == len(self.targets):
                        self._listening.set()
                elif kind == _OPEN:
                    queue: asyncio.Queue[tuple[int, bytes]] = asyncio.Queue()
                    self._queues[cid] = queue
                    self._spawn(self._connection(cid, int(data), queue))
                elif cid in self._queues:
                    self._queues[cid].put_nowait((kind, data))

    def _spawn(self, coroutine: object) -> None:
        task: asyncio.Task[None] = asyncio.create_task(coroutine)  # type: ignore[arg-type]
        self._pumps.add(task)
        task.add_done_callback(self._pumps.discard)

    async def _connection(self, cid: int, port: int,
                          queue: asyncio.Queue[tuple[int, bytes]]) -> None:
        """One connection made inside to ``port``, carried to its target."""
        try:
            reader, writer = await asyncio.open_connection(*self.targets[port])
        except (OSError, KeyError):
            self._queues.pop(cid, None)
            await self._send(cid, _CLOSE)
            return

        async def down() -> None:  # target -> sandbox
            try:
                while data := await reader.read(65536):
                    await self._send(cid, _DATA, data)
                await self._send(cid, _EOF)
            except (OSError, ConnectionError):
                await self._send(cid, _CLOSE)

        downward = asyncio.create_task(down())
        try:
            while True:  # sandbox -> target
                kind, data = await queue.get()
                if kind == _DATA:
                    writer.write(data)
                    await writer.drain()
                elif kind == _EOF:
                    if writer.can_write_eof():
                        writer.write_eof()
                    break
                else:
                    downward.cancel()
                    break
            await downward
        except (OSError, ConnectionError):
            pass
        finally:
            downward.cancel()
            self._queues.pop(cid, None)
            writer.close()
