"""TCP out of a sandbox without network, over one connection in through its port exposure.

An agent-server in a sandbox with ``network="none"`` has only its own loopback; it
needs to reach its LLM. A *relay* (``RELAY``, run with the image's ``python3``) starts
with the agent-server, at boot: it listens on 127.0.0.1:PORT inside for every forwarded
port (the LLM's, say) and on a control port of its own, whose number it writes to a
file. At hand-out, ``Egress`` connects to the control port through the backend's port
exposure (``Sandbox.endpoint``: the sandbox gains no network) and carries every
connection made inside over that one stream; the host opens a connection to the target
it was given for each. Only those targets are reachable, nothing else. Booting the relay
with the agent-server keeps a Python start (tens of milliseconds) off the hand-out.

Frames, both ways: ``!IBI`` (connection id, kind, length) + payload; kinds OPEN (sandbox
to host; id 0 announces a listening port), DATA, EOF (half-close), CLOSE. The relay is
code in the sandbox, so the host treats what comes from it as hostile: a frame that is
too long or malformed ends the egress, an OPEN for a port it was not given is closed,
and what waits for a slow target is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct

from rollbox.errors import CreateFailedError
from rollbox.sandbox import Sandbox

RELAY = r"""
import itertools, os, socket, struct, sys, threading
H = struct.Struct("!IBI")
OPEN, DATA, EOF, CLOSE = range(4)
lock = threading.Lock()
conns, done = {}, {}
def send(cid, kind, data=b""):
    try:
        with lock:
            host.sendall(H.pack(cid, kind, len(data)) + data)
    except OSError:
        os._exit(0)
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
listeners = [(socket.create_server(("127.0.0.1", int(p))), p) for p in sys.argv[2:]]
control = socket.create_server(("127.0.0.1", 0))
with open(sys.argv[1] + ".new", "w") as f:
    f.write(str(control.getsockname()[1]))
os.rename(sys.argv[1] + ".new", sys.argv[1])
host, _ = control.accept()
control.close()
for srv, port in listeners:
    threading.Thread(target=accept, args=(srv, port), daemon=True).start()
    send(0, OPEN, port.encode())
buf = b""
def read(n):
    global buf
    while len(buf) < n:
        d = host.recv(65536)
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
"""The relay: ``python3 -I -S -c RELAY PORT_FILE PORT...`` (writes its control port to
PORT_FILE once every port listens; serves the first connection to it, exits when that
connection ends)."""

_HEADER = struct.Struct("!IBI")
_OPEN, _DATA, _EOF, _CLOSE = range(4)
MAX_FRAME = 1 << 20
"""The relay sends at most 64 KiB a frame: anything longer is not the relay."""
QUEUED_FRAMES = 64
"""Per connection, frames from the sandbox waiting for a slow target."""
HELLO_TIMEOUT_S = 30.0


class Egress:
    """``targets[port]`` = (host, port) on the host's side, reached from 127.0.0.1:port
    inside ``sandbox`` through the relay listening on ``control_port`` there."""

    def __init__(self, sandbox: Sandbox, targets: dict[int, tuple[str, int]],
                 control_port: int) -> None:
        self.sandbox = sandbox
        self.targets = dict(targets)
        self.control_port = control_port
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task[None] | None = None
        self._queues: dict[int, asyncio.Queue[tuple[int, bytes]]] = {}
        self._pumps: set[asyncio.Task[None]] = set()
        self._send_lock = asyncio.Lock()
        self._listening: set[int] = set()
        self._all_listen = asyncio.Event()

    async def start(self) -> None:
        """Connect to the relay; returns once it says every port listens."""
        endpoint = await self.sandbox.endpoint(self.control_port)
        reader, self._writer = await asyncio.open_connection(endpoint.host, endpoint.port)
        self._task = asyncio.create_task(self._read(reader))
        hello = asyncio.ensure_future(self._all_listen.wait())
        await asyncio.wait({hello, self._task}, timeout=HELLO_TIMEOUT_S,
                           return_when=asyncio.FIRST_COMPLETED)
        hello.cancel()
        if not self._all_listen.is_set():
            raise CreateFailedError(
                f"the LLM relay in sandbox {self.sandbox.id} (port {self.control_port}) did "
                f"not announce ports {sorted(self.targets)} within {HELLO_TIMEOUT_S}s",
                sandbox_id=self.sandbox.id)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        tasks = [*self._pumps, *([self._task] if self._task else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _send(self, cid: int, kind: int, data: bytes = b"") -> None:
        assert self._writer is not None
        async with self._send_lock:
            self._writer.write(_HEADER.pack(cid, kind, len(data)) + data)
            await self._writer.drain()

    async def _read(self, reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, OSError, ValueError):
            while True:
                cid, kind, size = _HEADER.unpack(await reader.readexactly(_HEADER.size))
                if size > MAX_FRAME:
                    raise ValueError(f"a frame of {size} bytes")
                data = await reader.readexactly(size) if size else b""
                port = int(data) if kind == _OPEN and data.isdigit() else None
                if cid == 0:  # a port listens
                    if port in self.targets:
                        self._listening.add(port)
                    if self._listening == set(self.targets):
                        self._all_listen.set()
                elif kind == _OPEN and cid not in self._queues:
                    if port not in self.targets:
                        await self._send(cid, _CLOSE)
                        continue
                    queue: asyncio.Queue[tuple[int, bytes]] = asyncio.Queue(QUEUED_FRAMES)
                    self._queues[cid] = queue
                    self._spawn(self._connection(cid, self.targets[port], queue))
                elif cid in self._queues:
                    await self._queues[cid].put((kind, data))

    def _spawn(self, coroutine: object) -> None:
        task: asyncio.Task[None] = asyncio.create_task(coroutine)  # type: ignore[arg-type]
        self._pumps.add(task)
        task.add_done_callback(self._pumps.discard)

    async def _connection(self, cid: int, target: tuple[str, int],
                          queue: asyncio.Queue[tuple[int, bytes]]) -> None:
        """One connection made inside, carried to ``target``."""
        try:
            reader, writer = await asyncio.open_connection(*target)
        except OSError:
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
