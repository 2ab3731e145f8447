"""One bubblewrap process tree holding a sandbox's namespaces: start, readiness, kill.

bwrap is started by the zygote (a small process forks far faster than the backend's).
bwrap reports its child's pid, the sandbox's init, on ``--info-fd``; that child has
finished every mount when it drops its capabilities, right before it blocks on
``--block-fd``, so we wait until its ``CapEff`` reads zero (or, where the agent boots
with the sandbox, the agent's first process does). Its exit is watched through
a pidfd: a thousand idle sandboxes cost no thread and no polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rollbox.errors import CreateFailedError

from rollbox_local._agent import caps_dropped
from rollbox_local.pidfd import ProcessHandle

if TYPE_CHECKING:
    from rollbox_local.cgroups import CgroupPlan
    from rollbox_local.zygote import Zygote

READY_POLL_S = 0.0005
"""How often a boot somebody waits for is checked for readiness (``_next_poll``)."""
BACKGROUND_POLL_SHARE = 4
"""A boot nobody waits for (niced) is checked every quarter of the time it has taken so
far, at most every 8 ms: a few checks however long it takes under load, so the event
loop stays free for commands, and it is seen at most a quarter of its boot late."""
BLOCK_FD, INFO_FD = 3, 4  # where the zygote puts those pipes for bwrap


class Instance(ProcessHandle):
    """The holder process (it keeps the namespaces and mounts), watched through a pidfd,
    and the outer bwrap, its parent, which follows it out."""

    def __init__(self, holder: int) -> None:
        super().__init__(holder)
        try:
            self.monitor = ProcessHandle(_parent_of(holder))
        except BaseException:
            self.signal_kill()
            self.release()
            raise

    @property
    def holder(self) -> int:
        return self.pid

    async def kill(self) -> None:
        """Kill and wait until the holder and its bwrap parent are gone."""
        await super().kill()
        await asyncio.shield(self.monitor.exited)  # the outer bwrap follows its child at once
        self.monitor.release()

    @classmethod
    async def start(cls, *args: Any, **kwargs: Any) -> Instance:
        """Start bwrap and wait until the sandbox is ready (see ``_start``); with
        ``await_ready=False``, only until its holder is known: the caller boots the
        agent at once, and the agent's boot waits for the sandbox (``_agent.py``).

        Cancellation waits for the half-started sandbox and kills it, so no bwrap is
        ever left behind by an interrupted create."""
        task = asyncio.ensure_future(cls._start(*args, **kwargs))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await (await task).kill()
            raise

    @classmethod
    async def _start(
        cls,
        zygote: Zygote,
        argv: Sequence[str],
        *,
        block_fd: int,
        ids: tuple[int, int] | None,
        timeout: float,
        sandbox_id: str,
        log_path: str,
        make_dirs: Sequence[tuple[str, int]] = (),
        nice: int = 0,
        cgroup: CgroupPlan | None = None,
        tmpfs: dict[str, object] | None = None,
        await_ready: bool = True,
    ) -> Instance:
        loop = asyncio.get_running_loop()
        info_r, info_w = os.pipe2(os.O_CLOEXEC)
        try:
            zygote.spawn_bwrap(argv, block_fd=block_fd, info_fd=info_w, log_path=log_path,
                               make_dirs=make_dirs, ids=ids, nice=nice, cgroup=cgroup,
                               tmpfs=tmpfs)
        except OSError as exc:
            os.close(info_r)
            raise CreateFailedError(f"cannot start bwrap: {exc}", sandbox_id=sandbox_id) from exc
        finally:
            os.close(info_w)
        instance: Instance | None = None
        try:
            async with asyncio.timeout(timeout):
                info = await _read_all(loop, info_r)
                holder = int(json.loads(info)["child-pid"]) if info else 0
                if not holder:
                    raise CreateFailedError(bwrap_failure(log_path), sandbox_id=sandbox_id)
                instance = cls(holder)
                started = loop.time()
                while await_ready and not (ready := caps_dropped(holder)):
                    if ready is None:  # it is gone: bwrap failed
                        raise CreateFailedError(bwrap_failure(log_path), sandbox_id=sandbox_id)
                    await asyncio.sleep(_next_poll(loop.time() - started, background=nice > 0))
        except BaseException as exc:
            if instance is not None:
                await instance.kill()
            if isinstance(exc, TimeoutError):
                raise CreateFailedError(
                    f"sandbox {sandbox_id} was not ready within {timeout}s", sandbox_id=sandbox_id
                ) from None
            if isinstance(exc, ProcessLookupError | FileNotFoundError):
                raise CreateFailedError(bwrap_failure(log_path), sandbox_id=sandbox_id) from None
            raise
        return instance


def _next_poll(elapsed: float, *, background: bool) -> float:
    """Seconds until the next readiness check of a boot ``elapsed`` seconds old.

    Doubling the pause (as this did before) lets a background boot be seen up to its
    own length late: a standby that took 8.5 ms was seen at 15.5, and a reset right
    after a command waited for the difference."""
    if not background:
        return READY_POLL_S if elapsed < READY_POLL_S else 2 * READY_POLL_S
    return min(max(elapsed / BACKGROUND_POLL_SHARE, READY_POLL_S), 16 * READY_POLL_S)


def _parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("PPid:"):
                return int(line.split()[1])
    raise ProcessLookupError(pid)


async def _read_all(loop: asyncio.AbstractEventLoop, fd: int) -> bytes:
    """Read a pipe to EOF without blocking the loop (bwrap closes info-fd once written)."""
    os.set_blocking(fd, False)
    data = bytearray()
    done = loop.create_future()

    def readable() -> None:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            return
        data.extend(chunk)
        if (not chunk or data.rstrip().endswith(b"}")) and not done.done():
            done.set_result(None)

    loop.add_reader(fd, readable)
    try:
        await done
    finally:
        loop.remove_reader(fd)
        os.close(fd)
    return bytes(data)


def bwrap_failure(log_path: str) -> str:
    """Why bwrap failed, from its log, with a hint where user namespaces look off."""
    try:
        with open(log_path, "rb") as log:
            err = log.read(4096).decode(errors="replace").strip()
    except OSError:
        err = ""
    hint = ""
    if any(s in err for s in ("Operation not permitted", "No permissions", "uid map")):
        hint = " (user namespaces look unavailable: run `rollbox doctor`)"
    return f"bwrap failed to start the sandbox: {err or 'no output'}{hint}"
