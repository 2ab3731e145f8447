"""Careless input a newcomer types, each answered by one clear line: what is wrong, which
option or variable it came from, and what to do. Never a traceback, never a hang."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import pytest
from cli_support import Rollbox


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]
    says: tuple[str, ...]
    """Substrings the error output must hold (the option or variable named, the fix)."""
    env: dict[str, str] = field(default_factory=dict)
    code: int = 2
    as_root: bool = False
    """Only root reads it (ROLLBOX_SANDBOX_UID: an unprivileged user's sandboxes run as
    that user)."""


CASES = [
    Case("mistyped option", ("run", "--timout", "5", "--", "true"),
         ("usage: rollbox run", "--timout (did you mean --timeout?)")),
    Case("mistyped option of a nested command", ("simulate", "plan", "--image", "3"),
         ("usage: rollbox simulate plan",)),
    Case("negative timeout", ("run", "--timeout", "-1", "--", "true"),
         ("argument --timeout", "positive")),
    Case("nan timeout", ("run", "--timeout", "nan", "--", "true"), ("argument --timeout",)),
    Case("relative workdir", ("run", "--workdir", "src", "--", "true"),
         ("argument --workdir", "absolute path")),
    Case("empty image", ("run", "--image", "", "--", "true"), ("argument --image",)),
    Case("zero max output", ("run", "--max-output", "0", "--", "true"),
         ("argument --max-output",)),
    Case("unknown backend from the environment", ("run", "--", "true"),
         ("no backend named 'nonsense'", "ROLLBOX_BACKEND", "installed:"),
         env={"ROLLBOX_BACKEND": "nonsense"}),
    Case("unknown backend option", ("run", "--backend", "nonsense", "--", "true"),
         ("no backend named 'nonsense'", "installed:")),
    Case("sandbox uid not a number", ("run", "--", "true"),
         ("ROLLBOX_SANDBOX_UID='abc'", "not a whole number"),
         env={"ROLLBOX_SANDBOX_UID": "abc"}, as_root=True),
    Case("sandbox uid root", ("run", "--timeout", "5", "--", "id"),
         ("ROLLBOX_SANDBOX_UID='0'", "never run as root"), env={"ROLLBOX_SANDBOX_UID": "0"},
         as_root=True),
    Case("sandbox uid -1", ("run", "--", "true"), ("ROLLBOX_SANDBOX_UID='4294967295'",),
         env={"ROLLBOX_SANDBOX_UID": "4294967295"}, as_root=True),
    Case("image capacity", ("images", "ls"), ("ROLLBOX_IMAGE_CAPACITY_GB='lots'",),
         env={"ROLLBOX_IMAGE_CAPACITY_GB": "lots"}),
    Case("scratch", ("run", "--", "true"), ("ROLLBOX_SCRATCH='ram'",),
         env={"ROLLBOX_SCRATCH": "ram"}),
    Case("home is a file", ("run", "--", "true"), ("/etc/passwd", "ROLLBOX_HOME"),
         env={"ROLLBOX_HOME": "/etc/passwd/rollbox"}),
    Case("home under /proc", ("images", "ls"), ("/proc/rollbox", "ROLLBOX_HOME"),
         env={"ROLLBOX_HOME": "/proc/rollbox"}),
    Case("bwrap missing", ("run", "--", "true"), ("ROLLBOX_BWRAP='/nonexistent'",),
         env={"ROLLBOX_BWRAP": "/nonexistent"}),
    Case("registry reference", ("run", "--image", "docker.io/library/python:3.12", "--", "true"),
         ("registry reference", "docker save", "rollbox images import")),
    Case("registry name and tag", ("run", "--image", "python:3.12", "--", "true"),
         ("registry reference", "rollbox images import")),
    Case("import a registry reference", ("images", "import", "ghcr.io/org/task:1"),
         ("registry reference",)),
    Case("k8s negative replicas", ("k8s", "render", "--image", "x", "--replicas", "-3"),
         ("argument --replicas",)),
    Case("k8s node selector", ("k8s", "render", "--image", "x", "--node-selector", "bad"),
         ("argument --node-selector", "KEY=VALUE")),
    Case("k8s node selector value", ("k8s", "render", "--image", "x", "--node-selector",
                                     "pool=no spaces"), ("argument --node-selector", "value")),
    Case("k8s run id", ("k8s", "render", "--image", "x", "--run-id", "BAD_ID!"),
         ("argument --run-id", "lowercase")),
    Case("k8s run id from the environment", ("k8s", "render", "--image", "x"),
         ("ROLLBOX_RUN_ID='BAD_ID!'",), env={"ROLLBOX_RUN_ID": "BAD_ID!"}),
    Case("k8s namespace", ("k8s", "reap", "--namespace", "Team_A"), ("argument --namespace",)),
    Case("k8s namespace from the environment", ("k8s", "preflight"),
         ("ROLLBOX_K8S_NAMESPACE='Team A'",), env={"ROLLBOX_K8S_NAMESPACE": "Team A"}),
    Case("k8s toleration effect", ("k8s", "render", "--image", "x", "--toleration", "a=b:Never"),
         ("argument --toleration", "NoSchedule")),
    Case("k8s cpus", ("k8s", "render", "--image", "x", "--cpus", "0"), ("argument --cpus",)),
    Case("k8s preflight without a cluster", ("k8s", "preflight"),
         ("no Kubernetes credentials", "KUBECONFIG"), env={"KUBECONFIG": "/nonexistent"}),
    Case("k8s reap with a broken kubeconfig", ("k8s", "reap", "--kubeconfig", "/etc/hostname"),
         ("cannot use the kubeconfig /etc/hostname: not a kubeconfig",)),
    Case("blank home", ("images", "ls"), ("ROLLBOX_HOME=' '", "white space"),
         env={"ROLLBOX_HOME": " "}),
    Case("image import of a file that is no archive", ("images", "import", "/etc/hostname"),
         ("/etc/hostname is neither a directory nor a readable tar archive",)),
    Case("run through a server without a token", ("run", "--url", "http://127.0.0.1:1", "--",
                                                   "true"),
         ("no token for the rollbox server", "ROLLBOX_TOKEN")),
    Case("ps with no server ever started", ("ps",), ("no rollbox server has run here",
                                                     "start one with `rollbox serve`")),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_clear_line(rollbox: Rollbox, case: Case) -> None:
    if case.as_root and os.geteuid() != 0:
        pytest.skip("only root reads this variable")
    started = time.monotonic()
    result = rollbox(*case.args, env=case.env, timeout=60)
    assert time.monotonic() - started < 30, "a bad input took long to be refused"
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == case.code, result.stdout + result.stderr
    for words in case.says:
        assert words in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line and not line.startswith(
        ("usage:", " "))]
    assert len(lines) == 1, f"one message, nothing stray: {result.stderr}"

