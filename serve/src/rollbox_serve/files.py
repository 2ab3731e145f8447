"""File transfers through the server, without holding large files in Python objects.

A file of up to ``SMALL`` bytes travels as bytes (``read_file``/``write_file`` of the
backend). A larger one, or a client's ``download``, goes through an anonymous file in
memory (memfd): the request body is written into it and handed to the backend's
``upload``; the backend's ``download`` fills it and it goes out by ``sendfile``. The
local backend streams both through a pipe into the sandbox, so 100 MiB never becomes a
100 MiB ``bytes`` on the server.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from aiohttp import web
from rollbox.errors import UsageError
from rollbox.sandbox import Sandbox

SMALL = 1 << 20
CHUNK = 1 << 20


class RequestTooLargeError(UsageError):
    """A request body over the server's limit (HTTP 413)."""

    kind = "request_too_large"


def too_large(limit: int) -> RequestTooLargeError:
    return RequestTooLargeError(f"the file is larger than this server accepts ({limit} "
                                "bytes; rollbox serve --max-file-mb)")


@contextlib.contextmanager
def memory_file() -> Iterator[tuple[int, Path]]:
    """An open, empty file in memory (Linux's memfd) and a path to it, valid in this
    process only (nothing on disk, nothing another process can open by name)."""
    fd = os.memfd_create("rollbox-serve", os.MFD_CLOEXEC)
    try:
        yield fd, Path(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


async def send_file(request: web.Request, sandbox: Sandbox, path: str, *,
                    via_file: bool) -> web.StreamResponse:
    """Answer ``request`` with the sandbox file at ``path``."""
    if via_file:
        with memory_file() as (_, local):
            await sandbox.download(path, local)
            whole = web.FileResponse(local, headers={"Content-Type": "application/octet-stream"})
            await whole.prepare(request)  # sent (by sendfile) while the file is open
            return whole
    data = await sandbox.read_file(path)
    response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
    response.content_length = len(data)
    await response.prepare(request)
    view = memoryview(data)
    for start in range(0, len(view), CHUNK):  # a chunk at a time: see remote/http.py
        await response.write(view[start:start + CHUNK])
    await response.write_eof()
    return response


async def receive_file(request: web.Request, sandbox: Sandbox, path: str, mode: int,
                       limit: int) -> None:
    """Write the request's body to ``path`` in the sandbox (refusing more than
    ``limit`` bytes before any of it reaches the sandbox)."""
    size = request.content_length
    if size is not None and size > limit:
        raise too_large(limit)
    if size is not None and size <= SMALL:
        data = await request.content.read()
        if len(data) > limit:
            raise too_large(limit)
        await sandbox.write_file(path, data, mode=mode)
        return
    with memory_file() as (fd, local):
        received = 0
        while chunk := await request.content.readany():
            received += len(chunk)
            if received > limit:
                raise too_large(limit)
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view):]
        os.fchmod(fd, mode & 0o777)
        await sandbox.upload(local, path)
