"""Reading image sources: what a reference points at, its digest, and unpacking it.

Sources: an OCI image layout (a directory with ``oci-layout``, ``index.json`` and
``blobs/sha256/...``, or the same archived as a tar), a ``docker save`` archive (tar or
extracted directory: ``manifest.json`` plus a config and layer tars), or a plain directory
taken as the rootfs itself. Manifests, configs and blobs are read here and checked against
their sha256 digests; the layers are written out by ``rollbox_local.flatten`` (where the
safety rules of unpacking live).

Everything here is synchronous and blocking: the image store runs it in a worker thread.
Every problem with a source becomes ``ImageNotFoundError`` (nothing there) or
``ImageCorruptError`` (something there that cannot be read, verified or unpacked safely).
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
import tarfile
from collections.abc import Iterator, Mapping
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

from rollbox.errors import ImageCorruptError, ImageNotFoundError, ImageStoreFullError

from rollbox_local.flatten import Flattener, copy_tree, stat_walk

log = logging.getLogger(__name__)

Kind = Literal["oci", "docker", "dir"]
PREFIXES: Mapping[str, Kind] = {"oci:": "oci", "docker-archive:": "docker", "dir:": "dir"}
BASE_LABEL = "org.rollbox.base"

_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
_JSON_LIMIT = 16 * 1024 * 1024
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
        return "walk:" + stat_walk(path)[0]
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
            return Probe(kind, path, None, fp, stat_walk(path)[1])
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
    flat = Flattener(rootfs)
    try:
        if src_probe.kind == "dir":
            digest = copy_tree(path, flat)
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
        why = " ".join(str(exc).split())  # tarfile lists each compression it tried on a line
        raise ImageCorruptError(
            f"{path} is neither a directory nor a readable tar archive ({why})"
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


def _unpack_oci(src: _Source, flat: Flattener) -> tuple[str, dict[str, str], str | None, bool]:
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
    src: _Source, flat: Flattener
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
