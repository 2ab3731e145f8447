"""Reading image sources and flattening them into one root filesystem directory.

Sources: an OCI image layout (a directory with ``oci-layout``, ``index.json`` and
``blobs/sha256/...``, or the same archived as a tar), a ``docker save`` archive (tar or
extracted directory: ``manifest.json`` plus a config and layer tars), or a plain directory
taken as the rootfs itself.

Everything here is synchronous and blocking: the image store runs it in a worker thread.
Every problem with a source becomes ``ImageNotFoundError`` (nothing there) or
``ImageCorruptError`` (something there that cannot be read, verified or unpacked safely).

Safety while flattening layers: member paths are normalised and any that is absolute or
climbs out with ``..`` is refused; symlinks already in the rootfs are followed as a chroot
would (absolute targets restart at the rootfs, ``..`` stops at its top), so no write ever
lands outside it; device nodes are skipped; setuid/setgid bits are dropped (they mean
nothing in an unprivileged sandbox and are a hazard on the host); every blob is checked
against its sha256 digest.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import platform
import posixpath
import re
import shutil
import stat
import tarfile
from collections.abc import Iterator, Mapping
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

from rollbox.errors import ImageCorruptError, ImageNotFoundError, ImageStoreFullError

from rollbox_local.layers import remove_tree

log = logging.getLogger(__name__)

Kind = Literal["oci", "docker", "dir"]
PREFIXES: Mapping[str, Kind] = {"oci:": "oci", "docker-archive:": "docker", "dir:": "dir"}
BASE_LABEL = "org.rollbox.base"

_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
_JSON_LIMIT = 16 * 1024 * 1024
_CHUNK = 1024 * 1024
_MAX_SYMLINK_HOPS = 40
_INDEX_TYPES = {
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
}
_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


@dataclass(frozen=True)
class Probe:
    """What a source is, learnt without unpacking it."""

    kind: Kind
    path: Path
    digest: str | None  # known up front for OCI and docker; a plain dir's is its content hash
    fingerprint: str  # cheap id of the source's present state (see ``fingerprint``)
    estimate_bytes: int  # rough bytes it will take unpacked (a lower bound for gzip layers)


@dataclass(frozen=True)
class Unpacked:
    digest: str
    env: dict[str, str]
    workdir: str | None
    on_host: bool
    size_bytes: int


def split_path_ref(ref: str) -> tuple[Kind | None, Path] | None:
    """``(kind, path)`` if ``ref`` names a filesystem path, else None (it may be a name).

    An explicit prefix (``oci:``, ``docker-archive:``, ``dir:``) fixes the kind; a bare
    path (containing ``/``, starting with ``.``, or existing) leaves it to detection.
    """
    for prefix, kind in PREFIXES.items():
        if ref.startswith(prefix):
            return kind, Path(ref[len(prefix):]).expanduser().absolute()
    if "/" in ref or ref.startswith((".", "~")) or os.path.lexists(ref):
        return None, Path(ref).expanduser().absolute()
    return None


_REGISTRY_REF = re.compile(
    r"^(?:[a-z0-9][a-z0-9.-]*(?::[0-9]+)?/)?"  # registry host[:port]/ (optional)
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$")


def registry_hint(ref: str) -> str:
    """For a ref that looks like a registry reference (``python:3.12``,
    ``docker.io/library/python:3.12``), how to bring that image here: the local backend
    reads files, it never pulls. Empty for anything else."""
    if ref.startswith((".", "/", "~")) or not _REGISTRY_REF.match(ref):
        return ""
    first = ref.split("/", 1)[0] if "/" in ref else ""
    host = "." in first or ":" in first or first == "localhost"
    if not host and ":" not in ref.rsplit("/", 1)[-1]:
        return ""  # a bare word or relative path: no sign of a registry
    base = ref.rsplit("/", 1)[-1].split("@")[0].split(":")[0]
    return (f". {ref!r} looks like a registry reference, and the local backend does not "
            f"pull from registries: save the image to a file first (`docker save {ref} -o "
            f"{base}.tar`, or `skopeo copy docker://{ref} oci:{base}`), then "
            f"`rollbox images import {base}.tar --name {ref}` (see docs/local-backend.md, "
            "Images)")


def path_key(kind: Kind | None, path: Path) -> str:
    """The canonical spelling of a path ref: its absolute path, with the prefix if forced."""
    prefix = next((p for p, k in PREFIXES.items() if k == kind), "") if kind else ""
    return f"{prefix}{path}"


def detect(kind: Kind | None, path: Path) -> Kind:
    if not os.path.exists(path):
        raise ImageNotFoundError(f"no image at {path}: no such file or directory")
    if kind is not None:
        return kind
    if path.is_dir():
        if (path / "index.json").is_file() and (path / "oci-layout").is_file():
            return "oci"
        if (path / "manifest.json").is_file():
            return "docker"
        return "dir"
    with _source(path) as src:
        if src.has("index.json"):
            return "oci"
        if src.has("manifest.json"):
            return "docker"
    raise ImageCorruptError(
        f"{path} is a tar archive but neither an OCI image layout (index.json) nor a "
        "docker save archive (manifest.json)"
    )


def fingerprint(kind: Kind, path: Path) -> str:
    """A cheap id of the source's present state: when it is unchanged, so is the image.

    Files: size, mtime, inode. OCI layouts: the hash of index.json (everything it points
    to is content addressed). Docker dirs: manifest.json. Plain dirs: a stat walk.
    """
    try:
        if not path.is_dir():
            st = path.stat()
            return f"file:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}:{st.st_ctime_ns}"
        if kind == "oci":
            return "index:" + hashlib.sha256((path / "index.json").read_bytes()).hexdigest()
        if kind == "docker":
            return "manifest:" + hashlib.sha256((path / "manifest.json").read_bytes()).hexdigest()
        return "walk:" + _stat_walk(path)[0]
    except FileNotFoundError as exc:
        raise ImageNotFoundError(f"no image at {path}: {exc.strerror}") from exc
    except OSError as exc:
        raise ImageCorruptError(f"cannot read image {path}: {exc}") from exc


def probe(kind: Kind | None, path: Path) -> Probe:
    """Detect the format of ``path`` and learn its digest and size without unpacking."""
    kind = detect(kind, path)
    fp = fingerprint(kind, path)
    try:
        if kind == "dir":
            if not path.is_dir():
                raise ImageCorruptError(f"dir:{path} is not a directory")
            return Probe(kind, path, None, fp, _stat_walk(path)[1])
        with _source(path) as src:
            if kind == "oci":
                digest, manifest = _oci_manifest(src)
                layers = manifest.get("layers") or []
                est = sum(int(d.get("size", 0)) for d in layers if isinstance(d, dict))
                return Probe(kind, path, digest, fp, est)
            config_name, layer_names = _docker_entry(src)
            digest = "sha256:" + hashlib.sha256(src.read(config_name)).hexdigest()
            return Probe(kind, path, digest, fp, sum(src.size(n) for n in layer_names))
    except (OSError, tarfile.TarError, ValueError, KeyError, TypeError) as exc:
        raise _corrupt(path, exc) from exc


def unpack(
    src_probe: Probe, rootfs: Path, *, owner_uid: int | None = None, owner_gid: int | None = None
) -> Unpacked:
    """Flatten the source into ``rootfs`` (which must not exist yet)."""
    path = src_probe.path
    flat = _Flattener(rootfs)
    try:
        if src_probe.kind == "dir":
            digest = _copy_tree(path, flat)
            env: dict[str, str] = {}
            workdir: str | None = None
            on_host = False
        else:
            with _source(path) as src:
                if src_probe.kind == "oci":
                    digest, env, workdir, on_host = _unpack_oci(src, flat)
                else:
                    digest, env, workdir, on_host = _unpack_docker(src, flat)
        size = flat.finish(owner_uid, owner_gid)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise ImageStoreFullError(f"disk full while unpacking {path}: {exc}") from exc
        raise _corrupt(path, exc) from exc
    except (tarfile.TarError, ValueError, KeyError, TypeError, EOFError) as exc:
        raise _corrupt(path, exc) from exc
    return Unpacked(digest, env, workdir, on_host, size)


def _corrupt(path: Path, exc: BaseException) -> ImageCorruptError:
    if isinstance(exc, ImageCorruptError):
        return exc
    return ImageCorruptError(f"image {path} cannot be read: {type(exc).__name__}: {exc}")


# --- sources: a directory or a tar archive, read by member name --------------------------


class _Source:
    def has(self, name: str) -> bool:
        raise NotImplementedError

    def size(self, name: str) -> int:
        raise NotImplementedError

    def open(self, name: str) -> IO[bytes]:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def read(self, name: str) -> bytes:
        if self.size(name) > _JSON_LIMIT:
            raise ImageCorruptError(f"{name} is larger than {_JSON_LIMIT} bytes")
        with self.open(name) as f:
            return f.read()

    def json(self, name: str) -> Any:
        return json.loads(self.read(name))


def _clean_name(name: str) -> str:
    norm = posixpath.normpath(name)
    if norm.startswith("/") or norm == ".." or norm.startswith("../"):
        raise ImageCorruptError(f"path {name!r} in the image points outside it")
    return norm


class _DirSource(_Source):
    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, name: str) -> Path:
        return self.root / _clean_name(name)

    def has(self, name: str) -> bool:
        return self._path(name).is_file()

    def size(self, name: str) -> int:
        return self._path(name).stat().st_size

    def open(self, name: str) -> IO[bytes]:
        return self._path(name).open("rb")


class _TarSource(_Source):
    def __init__(self, path: Path) -> None:
        self.tar = tarfile.open(path, "r:*")  # noqa: SIM115 - closed by close()
        self.members: dict[str, tarfile.TarInfo] = {}
        for m in self.tar.getmembers():
            if m.isfile() or m.issym() or m.islnk():  # extractfile follows links
                self.members[posixpath.normpath(m.name.lstrip("/"))] = m

    def _member(self, name: str) -> tarfile.TarInfo:
        member = self.members.get(_clean_name(name))
        if member is None:
            raise ImageCorruptError(f"{name} is missing from the archive")
        return member

    def has(self, name: str) -> bool:
        return _clean_name(name) in self.members

    def size(self, name: str) -> int:
        return self._member(name).size

    def open(self, name: str) -> IO[bytes]:
        f = self.tar.extractfile(self._member(name))
        assert f is not None  # regular members always have a file
        return f

    def close(self) -> None:
        self.tar.close()


@contextmanager
def _source(path: Path) -> Iterator[_Source]:
    if path.is_dir():
        yield _DirSource(path)
        return
    try:
        src = _TarSource(path)
    except (tarfile.TarError, EOFError) as exc:
        raise ImageCorruptError(
            f"{path} is neither a directory nor a readable tar archive ({exc})"
        ) from exc
    except FileNotFoundError as exc:
        raise ImageNotFoundError(f"no image at {path}") from exc
    with closing(src):
        yield src


# --- OCI image layout ---------------------------------------------------------------------


def _blob_name(digest: object) -> str:
    m = _DIGEST.fullmatch(digest) if isinstance(digest, str) else None
    if m is None:
        raise ImageCorruptError(f"unsupported or malformed digest {digest!r} (need sha256:<hex>)")
    return f"blobs/sha256/{m.group(1)}"


def _read_verified(src: _Source, digest: str, what: str) -> bytes:
    data = src.read(_blob_name(digest))
    actual = "sha256:" + hashlib.sha256(data).hexdigest()
    if actual != digest:
        raise ImageCorruptError(f"{what} blob {digest} has digest {actual}: corrupt")
    return data


def host_platform() -> tuple[str, str]:
    machine = platform.machine().lower()
    return "linux", _ARCH.get(machine, machine)


def _pick(manifests: list[Any]) -> dict[str, Any]:
    os_name, arch = host_platform()
    exact = [m for m in manifests if isinstance(m, dict) and m.get("platform", {}).get(
        "os") == os_name and m["platform"].get("architecture") == arch]
    bare = [m for m in manifests if isinstance(m, dict) and "platform" not in m]
    chosen = exact or bare or (manifests if len(manifests) == 1 else [])
    if not chosen:
        raise ImageCorruptError(f"the image has no manifest for {os_name}/{arch}")
    result: dict[str, Any] = chosen[0]
    return result


def _oci_manifest(src: _Source) -> tuple[str, dict[str, Any]]:
    """The digest and parsed body of the image manifest for this machine's platform."""
    if not src.has("index.json"):
        raise ImageCorruptError("not an OCI image layout: index.json is missing")
    index = src.json("index.json")
    for _depth in range(4):
        manifests = index.get("manifests") if isinstance(index, dict) else None
        if not isinstance(manifests, list) or not manifests:
            raise ImageCorruptError("the OCI index lists no manifests")
        desc = _pick(manifests)
        digest = str(desc.get("digest"))
        body = json.loads(_read_verified(src, digest, "manifest"))
        if desc.get("mediaType") in _INDEX_TYPES or body.get("mediaType") in _INDEX_TYPES:
            index = body
            continue
        return digest, body
    raise ImageCorruptError("OCI image indexes nest too deeply")


def _config_fields(config: Any) -> tuple[dict[str, str], str | None, dict[str, str]]:
    inner = config.get("config") if isinstance(config, dict) else None
    inner = inner if isinstance(inner, dict) else {}
    env: dict[str, str] = {}
    for item in inner.get("Env") or []:
        if isinstance(item, str) and "=" in item:
            key, value = item.split("=", 1)
            env[key] = value
    workdir = inner.get("WorkingDir") or None
    labels = inner.get("Labels") or {}
    return env, (str(workdir) if workdir else None), (labels if isinstance(labels, dict) else {})


def _unpack_oci(src: _Source, flat: _Flattener) -> tuple[str, dict[str, str], str | None, bool]:
    digest, manifest = _oci_manifest(src)
    config = json.loads(_read_verified(src, manifest["config"]["digest"], "config"))
    env, workdir, labels = _config_fields(config)
    annotations = manifest.get("annotations") or {}
    on_host = labels.get(BASE_LABEL) == "host" or annotations.get(BASE_LABEL) == "host"
    for layer in manifest.get("layers") or []:
        media = str(layer.get("mediaType", ""))
        if "zstd" in media:
            raise ImageCorruptError(f"layer {layer['digest']} is zstd-compressed; re-export "
                                    "the image with gzip or uncompressed layers")
        name = _blob_name(layer["digest"])
        with src.open(name) as f:
            flat.apply_layer(f, layer["digest"], name)
    return digest, env, workdir, on_host


# --- docker save archive ------------------------------------------------------------------


def _docker_entry(src: _Source) -> tuple[str, list[str]]:
    manifest = src.json("manifest.json")
    if not isinstance(manifest, list) or not manifest or not isinstance(manifest[0], dict):
        raise ImageCorruptError("docker archive manifest.json lists no image")
    entry = manifest[0]
    layers = entry.get("Layers")
    if not isinstance(entry.get("Config"), str) or not isinstance(layers, list):
        raise ImageCorruptError("docker archive manifest.json lacks Config or Layers")
    return entry["Config"], [str(n) for n in layers]


def _unpack_docker(
    src: _Source, flat: _Flattener
) -> tuple[str, dict[str, str], str | None, bool]:
    config_name, layer_names = _docker_entry(src)
    raw = src.read(config_name)
    digest = "sha256:" + hashlib.sha256(raw).hexdigest()
    named = re.search(r"([0-9a-f]{64})(\.json)?$", config_name)
    if named and named.group(1) != digest.removeprefix("sha256:"):
        raise ImageCorruptError(f"docker config {config_name} has digest {digest}: corrupt")
    config = json.loads(raw)
    env, workdir, labels = _config_fields(config)
    diff_ids = (config.get("rootfs") or {}).get("diff_ids") or []
    if len(diff_ids) != len(layer_names):
        raise ImageCorruptError(
            f"docker config lists {len(diff_ids)} layer digests for {len(layer_names)} layers"
        )
    for name, diff_id in zip(layer_names, diff_ids, strict=True):
        # A layer stored as blobs/sha256/<hex> is named by its own digest; a legacy
        # <id>/layer.tar is uncompressed, so its digest is the config's diff_id.
        named = re.fullmatch(r"blobs/sha256/([0-9a-f]{64})", _clean_name(name))
        expected = f"sha256:{named.group(1)}" if named else str(diff_id)
        with src.open(name) as f:
            flat.apply_layer(f, expected, name)
    return digest, env, workdir, labels.get(BASE_LABEL) == "host"


# --- flattening ---------------------------------------------------------------------------


class _HashingReader:
    """Hashes every byte read through it, so a streamed layer is verified as it goes."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.hasher = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.hasher.update(data)
        return data

    def drain(self) -> str:
        while self.read(_CHUNK):
            pass
        return "sha256:" + self.hasher.hexdigest()


def _safe_mode(mode: int) -> int:
    return mode & 0o1777  # no setuid/setgid


@dataclass
class _Flattener:
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
                if hops > _MAX_SYMLINK_HOPS:
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
        reader = _HashingReader(blob)
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
                self.dir_modes["."] = _safe_mode(member.mode)
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
            self.dir_modes[rel] = _safe_mode(member.mode)
        elif member.isfile():
            self._remove(real)
            src = tar.extractfile(member)
            fd = os.open(real, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as out:
                if src is not None:
                    shutil.copyfileobj(src, out, _CHUNK)
                os.fchmod(out.fileno(), _safe_mode(member.mode))
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
            os.mkfifo(real, _safe_mode(member.mode))
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


def _stat_walk(root: Path) -> tuple[str, int]:
    """(hash of every entry's path, mode, size, mtime and inode; total file bytes)."""
    h = hashlib.sha256()
    total = 0
    for rel, st in _walk(root):
        h.update(f"{rel}\0{st.st_mode}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\n".encode(
            "utf-8", "surrogateescape"))
        if stat.S_ISREG(st.st_mode):
            total += st.st_size
    return h.hexdigest(), total


def _walk(root: Path) -> Iterator[tuple[str, os.stat_result]]:
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


def _copy_tree(src: Path, flat: _Flattener) -> str:
    """Copy a rootfs directory, hashing what it holds; returns that content digest."""
    h = hashlib.sha256()
    links: dict[tuple[int, int], str] = {}
    flat.dir_modes["."] = _safe_mode(src.stat().st_mode)
    h.update(f"root\0{flat.dir_modes['.']:o}\n".encode())
    for rel, st in _walk(src):
        source = os.path.join(src, rel)
        dest = os.path.join(flat.root, rel)
        tag = rel.encode("utf-8", "surrogateescape")
        mode = _safe_mode(st.st_mode)
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
                while chunk := fin.read(_CHUNK):
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
