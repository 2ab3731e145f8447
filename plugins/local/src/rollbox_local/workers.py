"""Helper processes for file work that must neither hold the event loop's GIL nor take
the CPU from commands: unpacking image layers and deleting directory trees.

A ``WorkerPool`` keeps up to ``size`` processes (``python -m rollbox_local._worker``),
started on first use, each serving one call at a time over pipes. Why not
``multiprocessing``: its forkserver and spawn start methods re-run the caller's
``__main__`` in every worker, which breaks a plain script that has no
``if __name__ == "__main__"`` guard, and a ProcessPoolExecutor cannot run some work at
a lower priority than other work. Here each pool has a niceness: work nobody waits on
(hydrating hinted images, deleting dropped layers) goes to a niced pool, so commands of
running rollouts keep the CPU on a small machine. A caller that starts waiting on such
work can ``boost`` it back to normal priority (where the OS allows it: root or
CAP_SYS_NICE).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Hashable
from typing import Any

from rollbox.errors import CreateFailedError

from rollbox_local import _worker
from rollbox_local._worker import read_exact

BACKGROUND_NICE = 10
"""Niceness of work nobody waits on: standby generations, prefetching, deletions."""


class WorkerDiedError(CreateFailedError):
    """A helper process died mid-call (OOM killer, a signal). Retryable: the pool starts
    a fresh process for the next call."""


class _Worker:
    def __init__(self, nice: int, era: int) -> None:
        self.era = era
        self.boosted = False
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self.proc = subprocess.Popen(
            # By path, not -m: the package is already imported by the time -m runs the
            # module, and runpy warns about that on every start.
            [sys.executable, _worker.__file__, str(nice)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd="/", env=env,
        )

    def call(self, op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        data = pickle.dumps((op, args, kwargs))
        try:
            self.proc.stdin.write(len(data).to_bytes(8, "big") + data)
            self.proc.stdin.flush()
            header = read_exact(self.proc.stdout, 8)
            body = None if header is None else read_exact(
                self.proc.stdout, int.from_bytes(header, "big"))
        except OSError:
            body = None
        if body is None:
            self.stop()
            raise WorkerDiedError(
                f"the helper process for {op} died (exit status {self.proc.returncode}); "
                "retry: the next call starts a fresh one")
        ok, value = pickle.loads(body)
        if not ok:
            raise value
        return value

    def renice(self, nice: int) -> None:
        with contextlib.suppress(OSError):  # lowering niceness needs root or CAP_SYS_NICE
            os.setpriority(os.PRIO_PROCESS, self.proc.pid, nice)

    def stop(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class WorkerPool:
    """Up to ``size`` helper processes at niceness ``nice``. ``call`` blocks (run it in
    a thread); it is safe to call from many threads at once."""

    def __init__(self, size: int, *, nice: int = 0) -> None:
        self.size = max(1, size)
        self.nice = nice
        self._idle: list[_Worker] = []
        self._started = 0
        self._running: dict[Hashable, _Worker] = {}
        self._cond = threading.Condition()
        self._era = 0  # bumped by shutdown: workers of an older era stop when returned

    def call(self, op: str, *args: Any, job: Hashable | None = None, **kwargs: Any) -> Any:
        """Run ``op`` (``"unpack"`` or ``"remove_tree"``) in a helper process.
        ``job`` names the call for ``boost``."""
        worker = self._take()
        if job is not None:
            with self._cond:
                self._running[job] = worker
        died = False
        try:
            return worker.call(op, args, kwargs)
        except WorkerDiedError:
            died = True
            raise
        finally:
            with self._cond:
                if job is not None:
                    self._running.pop(job, None)
                self._give_back(worker, died)

    def boost(self, job: Hashable) -> None:
        """Someone now waits for ``job``: run it at normal priority, if permitted."""
        with self._cond:
            worker = self._running.get(job)
        if worker is not None and self.nice > 0 and not worker.boosted:
            worker.boosted = True
            worker.renice(0)

    def shutdown(self) -> None:
        """Stop every helper (busy ones when their call returns). A later call starts
        new ones."""
        with self._cond:
            self._era += 1
            idle, self._idle = self._idle, []
            self._started = 0  # busy ones no longer count: they stop when they return
            self._cond.notify_all()
        for worker in idle:
            worker.stop()

    def _take(self) -> _Worker:
        with self._cond:
            while True:
                if self._idle:
                    return self._idle.pop()
                if self._started < self.size:
                    self._started += 1
                    era = self._era
                    break
                self._cond.wait()
        try:
            return _Worker(self.nice, era)
        except BaseException as exc:
            with self._cond:
                if era == self._era:
                    self._started -= 1
                self._cond.notify()
            if isinstance(exc, OSError):  # out of processes or file descriptors, say
                raise CreateFailedError(
                    f"cannot start a helper process ({exc}); retry when the machine has "
                    "room") from exc
            raise

    def _give_back(self, worker: _Worker, died: bool) -> None:
        """Under ``_cond``."""
        if worker.era != self._era:
            worker.stop()
        elif died:
            self._started -= 1
        else:
            if worker.boosted:
                worker.boosted = False
                worker.renice(self.nice)
            self._idle.append(worker)
        self._cond.notify()
