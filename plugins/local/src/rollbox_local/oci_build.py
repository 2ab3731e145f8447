"""Write small, valid images: an OCI image layout, its tar archive, a ``docker save`` tar.

For tests and for synthetic task sources, so they need no registry and no Docker. The
output is deterministic (zero mtimes, uid 0), so the same files give the same digest.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import posixpath
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from rollbox_local.oci import BASE_LABEL, host_platform

FileContent = bytes | tuple[bytes, int]  # content, or (content, mode)
_NONE: Mapping[str, Any] = MappingProxyType({})

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"


def layer_tar(files: Mapping[str, FileContent], *, symlinks: Mapping[str, str] = _NONE,
              dirs: Mapping[str, int] = _NONE) -> bytes:
    """An uncompressed layer tar. Parent directories are added (mode 0755) unless ``dirs``
    gives them a mode. Whiteouts are plain entries: ``{"etc/.wh.motd": b""}`` deletes
    ``etc/motd``, ``{"opt/.wh..wh..opq": b""}`` hides what lower layers put in ``opt``."""
    entries: dict[str, tarfile.TarInfo] = {}
    payload: dict[str, bytes] = {}

    def add_dir(path: str, mode: int = 0o755) -> None:
        parent = posixpath.dirname(path)
        if parent:
            add_dir(parent)
        if path not in entries or path in dirs:
            info = tarfile.TarInfo(path)
            info.type = tarfile.DIRTYPE
            info.mode = dirs.get(path, mode)
            entries[path] = info

    for path, mode in dirs.items():
        add_dir(path.strip("/"), mode)
    for path, content in files.items():
        data, mode = content if isinstance(content, tuple) else (content, 0o644)
        path = path.strip("/")
        if posixpath.dirname(path):
            add_dir(posixpath.dirname(path))
        info = tarfile.TarInfo(path)
        info.size, info.mode = len(data), mode
        entries[path], payload[path] = info, data
    for path, target in symlinks.items():
        path = path.strip("/")
        if posixpath.dirname(path):
            add_dir(posixpath.dirname(path))
        info = tarfile.TarInfo(path)
        info.type, info.linkname = tarfile.SYMTYPE, target
        entries[path] = info
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(entries):
            info = entries[path]
            info.uname = info.gname = "root"
            body = payload.get(path)
            tar.addfile(info, io.BytesIO(body) if body is not None else None)
    return buf.getvalue()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _config(diff_ids: list[str], env: Mapping[str, str], workdir: str | None,
            labels: Mapping[str, str]) -> bytes:
    os_name, arch = host_platform()
    inner: dict[str, Any] = {"Env": [f"{k}={v}" for k, v in env.items()]}
    if workdir:
        inner["WorkingDir"] = workdir
    if labels:
        inner["Labels"] = dict(labels)
    config = {"architecture": arch, "os": os_name, "config": inner,
              "rootfs": {"type": "layers", "diff_ids": diff_ids}}
    return json.dumps(config, sort_keys=True).encode()


def _layers(files: Mapping[str, FileContent], layers: Sequence[bytes]) -> list[bytes]:
    result = list(layers)
    if files or not result:
        result.append(layer_tar(files))
    return result


def write_oci_layout(
    dest: Path,
    files: Mapping[str, FileContent],
    *,
    base_host: bool = False,
    env: Mapping[str, str] = _NONE,
    workdir: str | None = None,
    layers: Sequence[bytes] = (),
    compress: bool = True,
    base_host_in: Literal["label", "annotation"] = "label",
) -> Path:
    """Write an OCI image layout directory at ``dest`` and return it.

    The image's layers are ``layers`` (raw tars, lowest first; see ``layer_tar``) and then
    one made of ``files``. ``compress`` gzips the layers. ``base_host`` marks the image as
    laid over the host's system dirs (label ``org.rollbox.base=host`` in the config, or a
    manifest annotation with ``base_host_in="annotation"``)."""
    blobs = dest / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)

    def put(data: bytes) -> str:
        digest = _digest(data)
        (blobs / digest.removeprefix("sha256:")).write_bytes(data)
        return digest

    raw_layers = _layers(files, layers)
    descriptors = []
    for raw in raw_layers:
        blob = gzip.compress(raw, mtime=0) if compress else raw
        media = OCI_LAYER + ("+gzip" if compress else "")
        descriptors.append({"mediaType": media, "digest": put(blob), "size": len(blob)})
    labels = {BASE_LABEL: "host"} if base_host and base_host_in == "label" else {}
    config = _config([_digest(r) for r in raw_layers], env, workdir, labels)
    manifest: dict[str, Any] = {
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": put(config), "size": len(config)},
        "layers": descriptors,
    }
    if base_host and base_host_in == "annotation":
        manifest["annotations"] = {BASE_LABEL: "host"}
    body = json.dumps(manifest, sort_keys=True).encode()
    os_name, arch = host_platform()
    index = {"schemaVersion": 2, "manifests": [{
        "mediaType": OCI_MANIFEST, "digest": put(body), "size": len(body),
        "platform": {"os": os_name, "architecture": arch},
    }]}
    (dest / "index.json").write_text(json.dumps(index, sort_keys=True))
    (dest / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    return dest


def archive_dir(src: Path, dest: Path, *, gzip_outer: bool = False) -> Path:
    """Tar the contents of ``src`` (e.g. an OCI layout) into ``dest``."""
    with tarfile.open(dest, "w:gz" if gzip_outer else "w") as tar:
        for path in sorted(src.rglob("*")):
            tar.add(path, arcname=path.relative_to(src).as_posix(), recursive=False)
    return dest


def write_docker_archive(
    dest: Path,
    files: Mapping[str, FileContent],
    *,
    base_host: bool = False,
    env: Mapping[str, str] = _NONE,
    workdir: str | None = None,
    layers: Sequence[bytes] = (),
    repo_tag: str = "rollbox/test:latest",
) -> Path:
    """Write a ``docker save`` archive (legacy layout: ``<id>/layer.tar`` + config JSON +
    ``manifest.json``) at ``dest`` and return it. Layers as in ``write_oci_layout``."""
    raw_layers = _layers(files, layers)
    labels = {BASE_LABEL: "host"} if base_host else {}
    config = _config([_digest(r) for r in raw_layers], env, workdir, labels)
    config_name = _digest(config).removeprefix("sha256:") + ".json"
    members: dict[str, bytes] = {config_name: config}
    layer_names = []
    for i, raw in enumerate(raw_layers):
        layer_id = hashlib.sha256(f"{i}:{_digest(raw)}".encode()).hexdigest()
        members[f"{layer_id}/layer.tar"] = raw
        members[f"{layer_id}/VERSION"] = b"1.0"
        layer_names.append(f"{layer_id}/layer.tar")
    members["manifest.json"] = json.dumps(
        [{"Config": config_name, "RepoTags": [repo_tag], "Layers": layer_names}]).encode()
    with tarfile.open(dest, "w") as tar:
        for name, data in members.items():
            if "/" in name and posixpath.dirname(name) not in tar.getnames():
                info = tarfile.TarInfo(posixpath.dirname(name))
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return dest
