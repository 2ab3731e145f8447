"""The local image store: images unpacked on this machine, within a disk capacity.

Layout under ``root``::

    index.json           refs → digest (names from ``import``, and paths already seen)
    images/<hex>/        one hydrated image: rootfs/ and meta.json (its mtime = last use)

(``images_index``: both are saved off the event loop, a moment after they change)
    tmp/<pid>-<token>/   an image being unpacked; renamed into images/ only when complete
    trash/               evicted images on their way out

An image appears in ``images/`` by one atomic rename, so a crash never leaves a half image
that looks complete; leftovers in ``tmp/`` from dead processes and ``trash/`` are removed
when a store opens. Images are keyed by content digest; a ref (a name, or a path with a
fingerprint of its state) maps to a digest. An evicted image keeps its refs, so a later pin
unpacks it again from its source path.

Resolving a ref to what must be hydrated is ``image_plans``; the disk budget and what is
evicted to keep it is ``image_capacity``; this module hydrates, pins and evicts.

Concurrency: one store object serves the coroutines of one event loop (its bookkeeping
runs on the loop thread, heavy work in worker threads). Several processes may share a
root: a pin is also a shared lock on ``pins/<digest>`` (``image_pins``), so neither
``remove`` nor eviction in any process takes an image a sandbox of another uses.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import functools
import json
import logging
import os
import secrets
import time
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from rollbox.backend import ahead_of_need
from rollbox.errors import (
    ImageCorruptError,
    ImageError,
    ImageNotFoundError,
    ImageStoreFullError,
    UsageError,
)

from rollbox_local import oci
from rollbox_local.image_capacity import RAISE_CAPACITY, Capacity, capacity_from_env, mb
from rollbox_local.image_pins import SharedPins
from rollbox_local.image_plans import HOST, Plan, Resolver, is_name, source_changed, validate_name
from rollbox_local.images_index import ImagesIndex
from rollbox_local.layers import remove_tree
from rollbox_local.paths import default_home, process_alive, sandbox_ids
from rollbox_local.workers import BACKGROUND_NICE, WorkerPool

log = logging.getLogger(__name__)

_MAX_PIN_ATTEMPTS = 5


@dataclass(frozen=True)
class Image:
    """A hydrated image, as the runtime needs it."""

    ref: str  # the reference it was asked for ("host", a name, or a path)
    digest: str  # "sha256:..." content id ("host" for the host image)
    rootfs: Path | None  # unpacked, flattened root filesystem; None for the pure host image
    on_host: bool  # lay rootfs over the host's read-only system dirs
    env: Mapping[str, str] = field(hash=False)  # from the OCI config Env
    workdir: str | None  # OCI config WorkingDir
    size_bytes: int  # bytes on disk of rootfs


HOST_IMAGE = Image(HOST, HOST, None, True, MappingProxyType({}), None, 0)


@dataclass(frozen=True)
class ImageInfo:
    """One stored image, for listings."""

    refs: tuple[str, ...]  # names first, then paths, that map to it
    digest: str
    size_bytes: int
    pinned: int
    last_used: float  # seconds since the epoch
    on_host: bool

    @property
    def name(self) -> str:
        return self.refs[0] if self.refs else self.digest


@dataclass
class ImageStoreStats:
    hydrations: int = 0
    evictions: int = 0
    hydration_seconds: float = 0.0  # total
    hydration_samples: list[float] = field(default_factory=list)  # one per hydration


@dataclass
class _Entry:
    digest: str
    size_bytes: int
    on_host: bool
    env: dict[str, str]
    workdir: str | None
    source: str | None
    last_used: float


class ImageStore:
    """Hydrated images on local disk, pinned while in use, evicted LRU within a capacity."""

    def __init__(
        self,
        root: Path,
        *,
        capacity_bytes: int,
        owner_uid: int | None = None,
        owner_gid: int | None = None,
        chores: WorkerPool | None = None,
    ) -> None:
        """``chores``: niced helper processes for work nobody waits on (hydrating hinted
        images, deleting evicted ones); the store makes its own if not given."""
        self.root = Path(root)
        self.owner_uid = owner_uid
        self.owner_gid = owner_gid
        self.stats = ImageStoreStats()
        self._images = self.root / "images"
        self._tmp = self.root / "tmp"
        self._trash = self.root / "trash"
        try:
            for d in (self._images, self._tmp, self._trash):
                d.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"cannot use the image store {self.root}: {exc.strerror or exc} "
                             f"({exc.filename}); set ROLLBOX_HOME to a directory you can "
                             "write") from None
        self._shared = SharedPins(self.root / "pins")
        self._entries: dict[str, _Entry] = {}
        self._index = ImagesIndex(self.root / "index.json", self._images)
        self._refs = self._index.refs
        self._pins: Counter[str] = Counter()
        self._resolver = Resolver(self._refs, self._entries)
        self._capacity = Capacity(capacity_bytes, self._entries, self._pins)
        self._inflight: dict[str, asyncio.Task[_Entry]] = {}  # by plan key
        self._inflight_keys: dict[str, str] = {}  # ref that started one → its plan key
        self._hinted: list[str] = []  # digests of the latest hint, soonest first
        self._hint_task: asyncio.Task[None] | None = None
        self._hint_errors: dict[str, ImageError] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._unpackers = WorkerPool(min(4, os.cpu_count() or 1))
        self._owns_chores = chores is None
        self.chores = chores or WorkerPool(1, nice=BACKGROUND_NICE)
        self._clean_leftovers()
        self._load_entries()

    @property
    def capacity_bytes(self) -> int:
        return self._capacity.capacity_bytes

    @classmethod
    def default(cls) -> ImageStore:
        """The store the local backend uses: ``$ROLLBOX_HOME/images`` (see
        ``paths.default_home``), ``$ROLLBOX_IMAGE_CAPACITY_GB`` GiB (default 20), files
        owned by the sandbox user when running as root."""
        ids = sandbox_ids()
        return cls(default_home() / "images", capacity_bytes=capacity_from_env(),
                   owner_uid=ids[0] if ids else None, owner_gid=ids[1] if ids else None)

    # --- public API -----------------------------------------------------------------------

    async def pin(self, ref: str) -> Image:
        """The image for ``ref``, hydrated, and marked in use until ``unpin``."""
        if ref == HOST:
            return HOST_IMAGE
        hint_error = self._hint_errors.pop(ref, None)
        if hint_error is not None and not hint_error.retryable:
            raise hint_error
        for _attempt in range(_MAX_PIN_ATTEMPTS):
            entry = await self._ensure(ref, background=ahead_of_need())
            # Between the hydration finishing and this coroutine resuming, another one
            # may have evicted it; then hydrate again.
            if entry.digest in self._entries and not self._pins[entry.digest]:
                await self._hold_shared(entry.digest)
            if entry.digest in self._entries:
                self._pins[entry.digest] += 1
                self._touch(entry)
                return self._image(ref, entry)
        raise ImageStoreFullError(
            f"image {ref!r} was evicted {_MAX_PIN_ATTEMPTS} times before it could be pinned; "
            f"the store is too small for the images in flight ({RAISE_CAPACITY})"
        )

    async def _hold_shared(self, digest: str) -> None:
        """The cross-process pin; a removal in another process holding the image right
        now is waited out in a thread (and if it removed the image, it is forgotten
        here, so the caller hydrates it again)."""
        if self._shared.try_hold(digest):
            return
        await asyncio.to_thread(self._shared.hold, digest)
        if not (self._images / digest.removeprefix("sha256:")).is_dir():
            self._shared.release(digest)
            self._entries.pop(digest, None)

    def unpin(self, image: Image) -> None:
        if image.digest == HOST:
            return
        if self._pins[image.digest] <= 0:
            log.warning("unpin of image %s that is not pinned (ignored)", image.digest)
            return
        self._pins[image.digest] -= 1
        if self._pins[image.digest] == 0:
            del self._pins[image.digest]
            self._shared.release(image.digest)
        entry = self._entries.get(image.digest)
        if entry is not None:
            self._touch(entry)

    async def prefetch(self, ref: str) -> Image:
        """Hydrate ``ref`` without pinning it (it may be evicted again under pressure)."""
        if ref == HOST:
            return HOST_IMAGE
        entry = await self._ensure(ref)
        return self._image(ref, entry)

    def hint(self, refs: Sequence[str]) -> None:
        """Images wanted next, soonest first: hydrate in the background as many as fit
        without evicting pinned images or ones earlier in this list. Replaces the previous
        hint. Failures are logged and raised by the next ``pin`` of that ref. Must be
        called on the event loop."""
        loop = asyncio.get_running_loop()
        if self._hint_task is not None:
            self._hint_task.cancel()  # hydrations it started keep running (they are shared)
        self._hinted = []
        for ref in refs:
            self._hint_errors.pop(ref, None)
        self._hint_task = loop.create_task(self._run_hint(list(refs)))
        self._keep(self._hint_task)

    def is_hydrated(self, ref: str) -> bool:
        if ref == HOST:
            return True
        try:
            plan = self._resolver.plan(ref, probe=True)  # reads the source's metadata only
        except ImageError:
            return False
        return plan.digest is not None and plan.digest in self._entries

    def list(self) -> list[ImageInfo]:
        refs_by_digest: dict[str, builtins.list[str]] = {}
        for ref, rec in sorted(self._refs.items(), key=lambda kv: (not is_name(kv[0]), kv[0])):
            refs_by_digest.setdefault(str(rec.get("digest")), []).append(ref)
        return [
            ImageInfo(tuple(refs_by_digest.get(e.digest, ())), e.digest, e.size_bytes,
                      self._pins[e.digest], e.last_used, e.on_host)
            for e in sorted(self._entries.values(), key=lambda e: -e.last_used)
        ]

    def remove(self, ref: str) -> None:
        """Delete the image ``ref`` names (a name, path or digest) and every ref to it."""
        if ref == HOST:
            raise UsageError("the host image is built in and cannot be removed")
        digest = self._resolver.stored_digest(ref)
        if self._pins[digest]:
            raise UsageError(
                f"image {ref!r} ({digest[:19]}) is in use by {self._pins[digest]} sandbox(es); "
                "close them first, then remove it"
            )
        with self._shared.exclusive(digest) as free:
            if not free:
                raise UsageError(
                    f"image {ref!r} ({digest[:19]}) is in use by a sandbox in another "
                    "process; close it (or stop that job) first, then remove the image")
            gone = [r for r, rec in self._refs.items() if rec.get("digest") == digest]
            if gone:
                self._index.update(dict.fromkeys(gone))
            trash = self._evict(digest, count=False) if digest in self._entries else None
        if trash is not None:
            remove_tree(trash)
        self._index.save()  # a blocking call anyway: on disk before it returns

    def import_path(self, path: Path | str, name: str | None = None) -> Image:
        """Unpack the image at ``path`` now (blocking) and register it under ``name``.

        ``path`` may carry a format prefix (``oci:``, ``docker-archive:``, ``dir:``). Call
        it off the event loop or when no coroutine uses this store."""
        if name is not None:
            validate_name(name)
        ref = str(path)
        plan = self._resolver.plan(ref, probe=True, force_probe=True)
        if name is not None:
            plan = Plan(plan.ref, plan.digest, plan.ref_key, plan.fingerprint, plan.probe,
                         (name,))
        if plan.digest is not None and plan.digest in self._entries:
            entry = self._entries[plan.digest]
            self._record(plan, entry)
        else:
            try:
                for trash in self._make_room(plan, spare=None):
                    remove_tree(trash)
                staging, unpacked, seconds = self._unpack_staged(plan)
                try:
                    if unpacked.digest in self._entries:
                        remove_tree(staging)
                        entry = self._entries[unpacked.digest]
                        self._record(plan, entry)
                    else:
                        for trash in self._make_room(plan, spare=None,
                                                     need=unpacked.size_bytes):
                            remove_tree(trash)
                        entry = self._register(plan, self._install(staging, unpacked), seconds)
                except BaseException:
                    remove_tree(staging)
                    raise
            finally:
                self._capacity.release(plan.key)
        self._touch(entry)
        self._index.save()  # a blocking call anyway: on disk before it returns
        return self._image(name or ref, entry)

    async def wait_idle(self) -> None:
        """Wait until the latest hint, hydrations and deletions in flight are all done."""
        while pending := [t for t in self._background if not t.done()]:
            await asyncio.gather(*pending, return_exceptions=True)

    async def aclose(self) -> None:
        """Stop background hints, wait for hydrations and deletions in flight, and stop
        the helper processes."""
        if self._hint_task is not None:
            self._hint_task.cancel()
        pending = list(self._background)
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        try:
            await self._index.flush()
        except OSError as exc:  # a cache for later runs: losing it costs a re-probe
            log.warning("could not save the image index %s: %s", self._index.path, exc)
        self._shared.close()
        self._unpackers.shutdown()
        if self._owns_chores:
            self.chores.shutdown()

    # --- hydration ------------------------------------------------------------------------

    async def _ensure(self, ref: str, *, spare: Collection[str] | None = None,
                      background: bool = False) -> _Entry:
        """The stored entry for ``ref``, hydrating it (once, however many ask) if needed.

        ``background``: nobody waits for it yet (a hint), so unpack it in the niced
        helper; a caller that then needs it boosts that helper back to normal priority."""
        key = self._inflight_keys.get(ref)
        if key is not None:  # the same ref on its way: skip looking at its source again
            if not background:
                self.chores.boost(key)
            return await asyncio.shield(self._inflight[key])
        plan = self._resolver.recheck(await asyncio.to_thread(self._resolver.plan, ref, probe=True))
        if plan.digest is not None and plan.digest in self._entries:
            entry = self._entries[plan.digest]
            self._record(plan, entry)
            return entry
        if plan.probe is None:  # evicted while we looked: look at its source this time
            plan = await asyncio.to_thread(self._resolver.plan, ref, probe=True, force_probe=True)
        task = self._inflight.get(plan.key)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._hydrate(plan, spare, background))
            self._inflight[plan.key] = task
            task.add_done_callback(functools.partial(self._forget_inflight, plan.key, ref))
            self._keep(task)
            self._inflight_keys[ref] = plan.key
        elif not background:
            self.chores.boost(plan.key)
        entry = await asyncio.shield(task)
        self._record(plan, entry)
        return entry

    def _forget_inflight(self, key: str, ref: str, _task: asyncio.Task[_Entry]) -> None:
        self._inflight.pop(key, None)
        if self._inflight_keys.get(ref) == key:
            del self._inflight_keys[ref]

    async def _hydrate(self, plan: Plan, spare: Collection[str] | None,
                       background: bool) -> _Entry:
        try:
            self._delete_later(self._make_room(plan, spare=spare))
            workers = self.chores if background else self._unpackers
            staging, unpacked, seconds = await asyncio.to_thread(
                self._unpack_staged, plan, workers)
            try:
                if unpacked.digest in self._entries:  # same content reached by another path
                    await asyncio.to_thread(remove_tree, staging)
                    return self._entries[unpacked.digest]
                self._delete_later(self._make_room(plan, spare=spare, need=unpacked.size_bytes))
                entry = await asyncio.to_thread(self._install, staging, unpacked)
                return self._register(plan, entry, seconds)
            except BaseException:
                await asyncio.to_thread(remove_tree, staging)
                raise
        finally:
            self._capacity.release(plan.key)

    def _unpack_staged(self, plan: Plan, workers: WorkerPool | None = None
                       ) -> tuple[Path, oci.Unpacked, float]:
        """Thread: unpack into a fresh staging dir and write its meta.json there."""
        assert plan.probe is not None
        start = time.monotonic()
        staging = self._tmp / f"{os.getpid()}-{secrets.token_hex(6)}"
        staging.mkdir()
        try:
            unpacked = (workers or self._unpackers).call(
                "unpack", plan.probe, staging / "rootfs", job=plan.key,
                owner_uid=self.owner_uid, owner_gid=self.owner_gid)
            if plan.digest is not None and plan.probe.kind != "dir" and (
                    unpacked.digest != plan.digest):
                raise ImageCorruptError(f"{plan.probe.path} changed while it was unpacked")
            if plan.expect is not None and unpacked.digest != plan.expect:
                raise source_changed(plan.ref, str(plan.ref_key))
            meta = {"digest": unpacked.digest, "size_bytes": unpacked.size_bytes,
                    "on_host": unpacked.on_host, "env": unpacked.env,
                    "workdir": unpacked.workdir, "source": plan.ref_key}
            (staging / "meta.json").write_text(json.dumps(meta, indent=1))
        except BaseException:
            remove_tree(staging)
            raise
        return staging, unpacked, time.monotonic() - start

    def _install(self, staging: Path, unpacked: oci.Unpacked) -> _Entry:
        """Thread: atomically move a staged image into place (or adopt an identical one
        another process put there meanwhile)."""
        final = self._images / unpacked.digest.removeprefix("sha256:")
        try:
            os.rename(staging, final)
        except OSError:
            if not (final / "meta.json").is_file():
                raise
            remove_tree(staging)  # another process stored the same image meanwhile
        entry = self._load_entry(final)
        if entry is None:
            raise ImageCorruptError(f"stored image {final} has no readable meta.json")
        return entry

    def _register(self, plan: Plan, entry: _Entry, seconds: float) -> _Entry:
        self._entries[entry.digest] = entry
        self.stats.hydrations += 1
        self.stats.hydration_seconds += seconds
        self.stats.hydration_samples.append(seconds)
        log.info("hydrated %s (%s) in %.2fs", plan.ref, mb(entry.size_bytes), seconds)
        self._record(plan, entry)
        return entry

    # --- capacity -------------------------------------------------------------------------

    def _make_room(self, plan: Plan, *, spare: Collection[str] | None,
                   need: int | None = None) -> builtins.list[Path]:
        """Reserve room for ``plan`` (``Capacity.reserve``) and evict what that takes;
        returns the evicted directories, for deletion. An image a sandbox in another
        process uses is passed over (its lock is held until it is moved out)."""
        with contextlib.ExitStack() as held:

            def evictable(digest: str) -> bool:
                return bool(held.enter_context(self._shared.exclusive(digest)))

            victims = self._capacity.reserve(plan, spare=spare, hinted=self._hinted,
                                             need=need, evictable=evictable)
            return [self._evict(digest) for digest in victims]

    def _evict(self, digest: str, *, count: bool = True) -> Path:
        """Forget ``digest`` and move its directory to trash (the caller deletes it)."""
        entry = self._entries.pop(digest)
        target = self._trash / f"{digest.removeprefix('sha256:')}-{secrets.token_hex(4)}"
        os.rename(self._images / digest.removeprefix("sha256:"), target)
        if count:
            self.stats.evictions += 1
            log.info("evicted %s (%s) to make room", digest[:19], mb(entry.size_bytes))
        return target

    def _delete_later(self, paths: builtins.list[Path]) -> None:
        for path in paths:
            self._keep(asyncio.get_running_loop().create_task(
                asyncio.to_thread(self.chores.call, "remove_tree", path)))

    # --- hints ----------------------------------------------------------------------------

    async def _run_hint(self, refs: builtins.list[str]) -> None:
        for ref in refs:
            if ref == HOST:
                continue
            try:
                entry = self._stored_entry(ref) or await self._ensure(
                    ref, spare=list(self._hinted), background=True)
            except ImageStoreFullError as exc:
                log.debug("hint stops at %r: %s", ref, exc.message)
                return  # the rest does not fit without evicting what is wanted sooner
            except UsageError as exc:
                log.warning("hinted image %r cannot be stored: %s", ref, exc.message)
                continue
            except ImageError as exc:
                log.warning("prefetch of hinted image %r failed: %s", ref, exc.message)
                self._hint_errors[ref] = exc
                continue
            except Exception as exc:  # a bug, but a hint must never crash the loop
                log.exception("prefetch of hinted image %r failed", ref)
                self._hint_errors[ref] = ImageCorruptError(f"prefetch of {ref!r} failed: {exc}")
                continue
            self._hinted.append(entry.digest)
            self._touch(entry)

    def _stored_entry(self, ref: str) -> _Entry | None:
        """The entry ``ref`` led to last time, if it is still stored, without looking at
        the source. Hints take this shortcut: the runner re-sends its window on every
        dispatch, and re-checking every source in a thread each time costs the event loop
        more than it could save. ``pin`` always checks the source."""
        try:
            return self._entries.get(self._resolver.stored_digest(ref))
        except ImageNotFoundError:
            return None

    # --- bookkeeping ----------------------------------------------------------------------

    def _keep(self, task: asyncio.Task[Any]) -> None:
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _image(self, ref: str, entry: _Entry) -> Image:
        rootfs = self._images / entry.digest.removeprefix("sha256:") / "rootfs"
        return Image(ref, entry.digest, rootfs, entry.on_host, MappingProxyType(dict(entry.env)),
                     entry.workdir, entry.size_bytes)

    def _touch(self, entry: _Entry) -> None:
        entry.last_used = time.time()
        self._index.used(entry.digest, entry.last_used)

    def _record(self, plan: Plan, entry: _Entry) -> None:
        """Remember which refs lead to ``entry`` (persisted only when something changed)."""
        changes: dict[str, dict[str, Any] | None] = {}
        if plan.ref_key is not None and plan.fingerprint is not None:
            path_rec: dict[str, Any] = {"digest": entry.digest, "fingerprint": plan.fingerprint}
            if self._refs.get(plan.ref_key) != path_rec:
                changes[plan.ref_key] = path_rec
        for name in plan.names:
            name_rec: dict[str, Any] = {"digest": entry.digest, "source": plan.ref_key}
            if self._refs.get(name) != name_rec:
                changes[name] = name_rec
        if changes:
            self._index.update(changes)

    def _load_entry(self, directory: Path) -> _Entry | None:
        try:
            meta_path = directory / "meta.json"
            meta = json.loads(meta_path.read_text())
            return _Entry(str(meta["digest"]), int(meta["size_bytes"]), bool(meta["on_host"]),
                          {str(k): str(v) for k, v in meta["env"].items()}, meta["workdir"],
                          meta.get("source"), meta_path.stat().st_mtime)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("ignoring unreadable stored image %s: %s", directory, exc)
            return None

    def _load_entries(self) -> None:
        for directory in self._images.iterdir():
            entry = self._load_entry(directory)
            if entry is not None and entry.digest.removeprefix("sha256:") == directory.name:
                self._entries[entry.digest] = entry

    def _clean_leftovers(self) -> None:
        for item in self._tmp.iterdir():
            pid = item.name.split("-", 1)[0]
            if pid.isdigit() and process_alive(int(pid)):
                continue
            with contextlib.suppress(OSError):
                remove_tree(item)
        for item in self._trash.iterdir():
            with contextlib.suppress(OSError):
                remove_tree(item)
