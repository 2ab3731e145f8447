"""A helper process of ``rollbox_local.workers``: ``python -m rollbox_local._worker NICE``.

Reads requests from stdin and writes replies to stdout, each an 8-byte big-endian length
and a pickle: ``(op, args, kwargs)`` in, ``(True, result)`` or ``(False, exception)`` out.
Both ends are rollbox's own, in the same trust domain (the host side).
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
from collections.abc import Callable
from typing import IO, Any, BinaryIO


def _ops() -> dict[str, Callable[..., Any]]:
    from rollbox_local import layers, oci

    return {"unpack": oci.unpack, "remove_tree": layers.remove_tree}


def read_exact(stream: BinaryIO | IO[bytes], size: int) -> bytes | None:
    """``size`` bytes, or None at end of file (a buffered read returns short only there)."""
    data = stream.read(size)
    return data if len(data) == size else None


def serve(requests: BinaryIO, replies: BinaryIO) -> None:
    ops = _ops()
    while (header := read_exact(requests, 8)) is not None:
        body = read_exact(requests, int.from_bytes(header, "big"))
        if body is None:
            return
        op, args, kwargs = pickle.loads(body)
        try:
            reply: tuple[bool, Any] = (True, ops[op](*args, **kwargs))
        except Exception as exc:  # the caller re-raises it
            reply = (False, exc)
        try:
            data = pickle.dumps(reply)
        except Exception as exc:  # an unpicklable result or exception
            data = pickle.dumps((False, RuntimeError(f"{op} failed: {reply[1]!r} ({exc})")))
        replies.write(len(data).to_bytes(8, "big") + data)
        replies.flush()


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the caller to handle
    nice = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    if nice:
        os.nice(nice)
    serve(sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__":
    main()
