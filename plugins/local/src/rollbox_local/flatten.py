"""Flattening image layers into one root filesystem directory, safely.

``Flattener`` writes layer tars, in order, into a fresh directory and applies OCI
whiteouts; ``copy_tree`` copies a plain rootfs directory through the same rules.
Member paths are normalised and any that is absolute or climbs out with ``..`` is
refused; symlinks already in the rootfs are followed as a chroot would (absolute targets
restart at the rootfs, ``..`` stops at its top), so no write ever lands outside it;
device nodes are skipped; setuid/setgid bits are dropped; every layer is hashed as it
streams by (``HashingReader``) and checked against its digest. Blocking: the image store
runs it in a worker.
"""

from __future__ import annotations

import hashlib
import logging
import os
import posixpath
import shutil
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from rollbox.errors import ImageCorruptError

from rollbox_local.layers import remove_tree

log = logging.getLogger(__name__)

CHUNK = 1024 * 1024
MAX_SYMLINK_HOPS = 40


class HashingReader:
    """Hashes every byte read through it, so a streamed layer is verified as it goes."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.hasher = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.hasher.update(data)
        return data

    def drain(self) -> str:
        while self.read(CHUNK):
            pass
        return "sha256:" + self.hasher.hexdigest()


def safe_mode(mode: int) -> int:
    return mode & 0o1777  # no setuid/setgid


@dataclass
class Flattener:
    """Writes layers, in order, into one directory, applying OCI whiteouts."""

    root: Path
    dir_modes: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        os.mkdir(self.root, 0o700)
        self.dir_modes["."] = 0o755

    # Resolution: the real directory (relative to root) holding a member, following
    # symlinks already in the rootfs the way a chroot would.
    def _resolve_dir(self, parts: list[str], *, create: bool) -> list[str]:
        resolved: list[str] = []
        pending = list(parts)
        hops = 0
        while pending:
            comp = pending.pop(0)
            if comp in ("", "."):
                continue
            if comp == "..":
                if resolved:
                    resolved.pop()
                continue
            real = os.path.join(self.root, *resolved, comp)
            try:
                st = os.lstat(real)
            except FileNotFoundError:
                if not create:
                    raise ImageCorruptError(f"{'/'.join(parts)} does not exist") from None
                os.mkdir(real, 0o700)
                self.dir_modes.setdefault("/".join([*resolved, comp]), 0o755)
                resolved.append(comp)
                continue
            if stat.S_ISLNK(st.st_mode):
                hops += 1
                if hops > MAX_SYMLINK_HOPS:
                    raise ImageCorruptError(f"too many symlinks resolving {'/'.join(parts)}")
                target = os.readlink(real)
                if target.startswith("/"):
                    resolved = []
                pending = target.split("/") + pending
                continue
            if not stat.S_ISDIR(st.st_mode):
                if not create:
                    raise ImageCorruptError(f"{'/'.join(parts)}: a file is in the way")
                os.unlink(real)
                os.mkdir(real, 0o700)
                self.dir_modes.setdefault("/".join([*resolved, comp]), 0o755)
            resolved.append(comp)
        return resolved

    def _split(self, name: str) -> list[str] | None:
        """Member name → path components; None for the root itself. Refuses escapes."""
        if name.startswith("/"):
            raise ImageCorruptError(f"layer member {name!r} has an absolute path: refused")
        norm = posixpath.normpath(name)
        if norm == ".." or norm.startswith("../"):
            raise ImageCorruptError(f"layer member {name!r} escapes the rootfs: refused")
        if norm == ".":
            return None
        return norm.split("/")

    def _remove(self, real: str) -> None:
        if os.path.isdir(real) and not os.path.islink(real):
            remove_tree(Path(real))
        elif os.path.lexists(real):
            os.unlink(real)

    def apply_layer(self, blob: IO[bytes], expected_digest: str, label: str) -> None:
        reader = HashingReader(blob)
        added: set[str] = set()
        deferred_opaque: list[str] = []
        with tarfile.open(fileobj=reader, mode="r|*") as tar:  # type: ignore[call-overload]
            for member in tar:
                self._apply_member(tar, member, added, deferred_opaque)
        for rel in deferred_opaque:
            self._clear_opaque(rel, added)
        actual = reader.drain()
        if actual != expected_digest:
            raise ImageCorruptError(f"layer {label} has digest {actual}, expected "
                                    f"{expected_digest}: corrupt or tampered")

    def _clear_opaque(self, rel: str, added: set[str]) -> None:
        real = os.path.join(self.root, rel)
        if not os.path.isdir(real):
            return
        for child in os.listdir(real):
            child_rel = posixpath.normpath(posixpath.join(rel, child))
            if child_rel not in added:
                self._remove(os.path.join(real, child))

    def _apply_member(self, tar: tarfile.TarFile, member: tarfile.TarInfo,
                      added: set[str], deferred_opaque: list[str]) -> None:
        parts = self._split(member.name)
        if parts is None:
            if member.isdir():
                self.dir_modes["."] = safe_mode(member.mode)
            return
        base = parts[-1]
        parent = self._resolve_dir(parts[:-1], create=True)
        parent_rel = "/".join(parent) or "."
        if base == ".wh..wh..opq":
            # Opaque: hide everything lower layers put in this directory. Applied after the
            # layer, so entries this layer adds (in any order) survive.
            deferred_opaque.append(parent_rel)
            return
        if base.startswith(".wh."):
            rel = posixpath.normpath(posixpath.join(parent_rel, base[len(".wh."):]))
            if rel not in added:
                self._remove(os.path.join(self.root, rel))
            return
        rel = posixpath.normpath(posixpath.join(parent_rel, base))
        real = os.path.join(self.root, rel)
        if member.isdir():
            if not (os.path.isdir(real) and not os.path.islink(real)):
                self._remove(real)
                os.mkdir(real, 0o700)
            self.dir_modes[rel] = safe_mode(member.mode)
        elif member.isfile():
            self._remove(real)
            src = tar.extractfile(member)
            fd = os.open(real, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as out:
                if src is not None:
                    shutil.copyfileobj(src, out, CHUNK)
                os.fchmod(out.fileno(), safe_mode(member.mode))
            os.utime(real, (member.mtime, member.mtime), follow_symlinks=False)
        elif member.issym():
            self._remove(real)
            os.symlink(member.linkname, real)
        elif member.islnk():
            target = self._split(member.linkname)
            if target is None:
                raise ImageCorruptError(f"hard link {member.name!r} to the rootfs itself")
            tdir = self._resolve_dir(target[:-1], create=False)
            treal = os.path.join(self.root, *tdir, target[-1])
            if not os.path.lexists(treal) or os.path.isdir(treal):
                raise ImageCorruptError(f"hard link {member.name!r} → {member.linkname!r}: "
                                        "no such file in the image")
            if treal != real:
                self._remove(real)
                os.link(treal, real, follow_symlinks=False)
        elif member.isfifo():
            self._remove(real)
            os.mkfifo(real, safe_mode(member.mode))
        else:
            log.debug("skipping %s (device node or unsupported type)", member.name)
            return
        added.add(rel)

    def finish(self, owner_uid: int | None, owner_gid: int | None) -> int:
        """Apply directory modes (last, so unpacking could write into them), chown if
        asked, and return the bytes the rootfs occupies on disk."""
        for rel, mode in sorted(self.dir_modes.items(), key=lambda kv: -kv[0].count("/")):
            real = os.path.join(self.root, rel)
            if os.path.isdir(real) and not os.path.islink(real):
                os.chmod(real, mode)
        size = 0
        seen: set[tuple[int, int]] = set()
        for dirpath, dirnames, filenames in os.walk(self.root):
            for name in [".", *dirnames, *filenames]:
                path = os.path.join(dirpath, name) if name != "." else dirpath
                st = os.lstat(path)
                if owner_uid is not None or owner_gid is not None:
                    os.lchown(path, -1 if owner_uid is None else owner_uid,
                              -1 if owner_gid is None else owner_gid)
                    if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o6000:
                        os.chmod(path, stat.S_IMODE(st.st_mode))  # chown may clear bits
                if (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
                size += st.st_blocks * 512
        return size


# --- plain directories --------------------------------------------------------------------


def stat_walk(root: Path) -> tuple[str, int]:
    """(hash of every entry's path, mode, size, mtime and inode; total file bytes)."""
    h = hashlib.sha256()
    total = 0
    for rel, st in walk(root):
        h.update(f"{rel}\0{st.st_mode}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\n".encode(
            "utf-8", "surrogateescape"))
        if stat.S_ISREG(st.st_mode):
            total += st.st_size
    return h.hexdigest(), total


def walk(root: Path) -> Iterator[tuple[str, os.stat_result]]:
    """Every entry under root (not root itself), sorted, depth first, symlinks not followed."""
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        with os.scandir(os.path.join(root, rel_dir)) as it:
            entries = sorted(it, key=lambda e: e.name)
        subdirs = []
        for entry in entries:
            rel = posixpath.join(rel_dir, entry.name) if rel_dir else entry.name
            st = entry.stat(follow_symlinks=False)
            yield rel, st
            if stat.S_ISDIR(st.st_mode):
                subdirs.append(rel)
        stack.extend(reversed(subdirs))


def copy_tree(src: Path, flat: Flattener) -> str:
    """Copy a rootfs directory, hashing what it holds; returns that content digest."""
    h = hashlib.sha256()
    links: dict[tuple[int, int], str] = {}
    flat.dir_modes["."] = safe_mode(src.stat().st_mode)
    h.update(f"root\0{flat.dir_modes['.']:o}\n".encode())
    for rel, st in walk(src):
        source = os.path.join(src, rel)
        dest = os.path.join(flat.root, rel)
        tag = rel.encode("utf-8", "surrogateescape")
        mode = safe_mode(st.st_mode)
        if stat.S_ISDIR(st.st_mode):
            os.mkdir(dest, 0o700)
            flat.dir_modes[rel] = mode
            h.update(b"D\0" + tag + f"\0{mode:o}\n".encode())
        elif stat.S_ISLNK(st.st_mode):
            target = os.readlink(source)
            os.symlink(target, dest)
            h.update(b"L\0" + tag + b"\0" + target.encode("utf-8", "surrogateescape") + b"\n")
        elif stat.S_ISREG(st.st_mode):
            key = (st.st_dev, st.st_ino)
            if st.st_nlink > 1 and key in links:
                os.link(os.path.join(flat.root, links[key]), dest)
                h.update(b"H\0" + tag + b"\0" + links[key].encode("utf-8", "surrogateescape")
                         + b"\n")
                continue
            links[key] = rel
            fh = hashlib.sha256()
            with open(source, "rb") as fin, open(dest, "xb") as fout:
                while chunk := fin.read(CHUNK):
                    fh.update(chunk)
                    fout.write(chunk)
                os.fchmod(fout.fileno(), mode)
            os.utime(dest, ns=(st.st_atime_ns, st.st_mtime_ns))
            h.update(b"F\0" + tag + f"\0{mode:o}\0{fh.hexdigest()}\n".encode())
        elif stat.S_ISFIFO(st.st_mode):
            os.mkfifo(dest, mode)
            h.update(b"P\0" + tag + f"\0{mode:o}\n".encode())
        else:
            log.debug("skipping %s (device node or socket)", source)
    return "sha256:" + h.hexdigest()
