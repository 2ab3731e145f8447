"""A process watched through a pidfd: exit noticed by the event loop, kill without
pid-reuse races, no thread and no polling per process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal


class ProcessHandle:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._fd = os.pidfd_open(pid)
        loop = asyncio.get_running_loop()
        self.exited: asyncio.Future[None] = loop.create_future()
        loop.add_reader(self._fd, self._on_exit)

    def _on_exit(self) -> None:
        self.release()  # nothing more to do with it, whether or not anyone calls kill()
        if not self.exited.done():
            self.exited.set_result(None)

    @property
    def alive(self) -> bool:
        return not self.exited.done()

    def signal_kill(self) -> None:
        """SIGKILL it now; do not wait."""
        if self._fd >= 0 and self.alive:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._fd, signal.SIGKILL)

    async def kill(self) -> None:
        """SIGKILL it and wait until it has exited; then release the pidfd."""
        if self._fd < 0:
            return
        self.signal_kill()
        await asyncio.shield(self.exited)
        self.release()

    def release(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError, ValueError):
                asyncio.get_running_loop().remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1
