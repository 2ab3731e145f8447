"""Resolving an image reference: which stored image it names, and whether (and how) its
source must be read to hydrate it.

A reference is ``host``, a name given by ``rollbox images import``, a path (with an
optional format prefix) or a digest. The ref index (``images_index``) maps names and
paths to digests, a path with a fingerprint of its state, so an unchanged source is not
read again; a ``Plan`` says what a hydration starts from. Blocking where it reads a
source's metadata: the store calls it in a thread.
"""

from __future__ import annotations

import os
from collections.abc import Container, Mapping
from dataclasses import dataclass
from typing import Any

from rollbox.errors import ImageNotFoundError, UsageError

from rollbox_local import oci

HOST = "host"


@dataclass(frozen=True)
class Plan:
    """How to get a ref: already stored (``stored``), or from a probed source."""

    ref: str
    digest: str | None
    ref_key: str | None = None  # key in the ref index to record after hydration
    fingerprint: str | None = None
    probe: oci.Probe | None = None
    names: tuple[str, ...] = ()  # names to point at the result too
    expect: str | None = None  # the digest a name recorded: its source must still give it

    @property
    def key(self) -> str:
        """Identity of the hydration, so concurrent requests share one."""
        if self.digest is not None:
            return self.digest
        return f"src:{self.ref_key}"


def is_name(key: str) -> bool:
    """Names and path refs share the index; a path ref's key is always absolute."""
    return not key.startswith("/") and not key.startswith(tuple(oci.PREFIXES))


def validate_name(name: str) -> None:
    bad = (
        not name or name == HOST or name.startswith(("sha256:", ".", "~", "/"))
        or not is_name(name) or any(c.isspace() or c == "\0" for c in name)
    )
    if bad:
        raise UsageError(
            f"invalid image name {name!r}: use e.g. 'python-3.11' or 'swebench/astropy:1'; "
            "not 'host', no spaces, not starting with '/', '.', '~', 'sha256:' or a format "
            "prefix (oci:, docker-archive:, dir:)"
        )


def source_changed(name: str, source: str) -> ImageNotFoundError:
    return ImageNotFoundError(
        f"image {name!r} was evicted from the store and its source {source} now holds a "
        f"different image; import it again (rollbox images import PATH --name {name})"
    )


class Resolver:
    """Plans hydrations from the ref index (``refs``) and the stored digests (``stored``),
    both the store's own, read live."""

    def __init__(self, refs: Mapping[str, Mapping[str, Any]], stored: Container[str]) -> None:
        self._refs = refs
        self._stored = stored

    def stored_digest(self, ref: str) -> str:
        """The digest a name, path or digest refers to, without probing anything."""
        if ref in self._stored:
            return ref
        rec = self._refs.get(ref)
        if rec is None:
            split = oci.split_path_ref(ref)
            if split is not None:
                kind, path = split
                rec = self._refs.get(oci.path_key(kind, path))
        if rec is None:
            raise ImageNotFoundError(f"no stored image for {ref!r} (see rollbox images ls)")
        return str(rec["digest"])

    def plan(self, ref: str, *, probe: bool, force_probe: bool = False) -> Plan:
        """Resolve ``ref`` to a digest if that is cheap, and probe its source if needed.

        Blocking (reads the source's metadata): call it in a thread from async code."""
        if ref.startswith("sha256:"):
            if ref in self._stored:
                return Plan(ref, ref)
            raise ImageNotFoundError(f"no stored image with digest {ref}")
        split = oci.split_path_ref(ref)
        if split is None or (ref in self._refs and is_name(ref)):
            return self._plan_name(ref, probe=probe, force_probe=force_probe)
        kind, path = split
        ref_key = oci.path_key(kind, path)
        if not os.path.lexists(path):
            also = "" if ref.startswith(("/", ".", "~")) or kind else " and no imported name"
            raise ImageNotFoundError(
                f"no image {ref!r}: no file or directory at {path}{also}")
        rec = self._refs.get(ref_key)
        if rec is not None and not force_probe:
            fp = oci.fingerprint(oci.detect(kind, path), path)
            if rec.get("fingerprint") == fp and rec.get("digest") in self._stored:
                return Plan(ref, str(rec["digest"]), ref_key, fp)
        if not probe:
            return Plan(ref, None, ref_key)
        pr = oci.probe(kind, path)
        digest = pr.digest
        if digest is None and rec is not None and rec.get("fingerprint") == pr.fingerprint:
            digest = str(rec["digest"])  # a plain dir seen before, unchanged
        return Plan(ref, digest, ref_key, pr.fingerprint, pr)

    def _plan_name(self, name: str, *, probe: bool, force_probe: bool) -> Plan:
        rec = self._refs.get(name)
        if rec is None:
            raise ImageNotFoundError(
                f"no image {name!r}: it is not 'host', not an imported name (see rollbox "
                "images ls) and no file or directory by that path exists"
            )
        digest = str(rec["digest"])
        if (digest in self._stored and not force_probe) or not probe:
            return Plan(name, digest if digest in self._stored else None)
        source = rec.get("source")
        split = oci.split_path_ref(source) if isinstance(source, str) else None
        if split is None or not os.path.lexists(split[1]):
            raise ImageNotFoundError(
                f"image {name!r} was evicted from the store and its source {source!r} no "
                f"longer exists; import it again (rollbox images import PATH --name {name})"
            )
        plan = self.plan(str(source), probe=True, force_probe=force_probe)
        if plan.digest is not None and plan.digest != digest:
            raise source_changed(name, str(source))
        return Plan(name, plan.digest, plan.ref_key, plan.fingerprint, plan.probe, (name,),
                     expect=digest)

    def recheck(self, plan: Plan) -> Plan:
        """After the thread hop: a concurrent hydration may have learnt this source's digest."""
        if plan.digest is None and plan.ref_key is not None:
            rec = self._refs.get(plan.ref_key)
            if rec is not None and rec.get("fingerprint") == plan.fingerprint:
                return Plan(plan.ref, str(rec["digest"]), plan.ref_key, plan.fingerprint,
                             plan.probe, plan.names, plan.expect)
        return plan
