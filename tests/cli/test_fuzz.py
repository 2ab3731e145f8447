"""A bounded, seeded fuzz of the ``rollbox`` command line and the ``ROLLBOX_*`` variables:
whatever a user types, the answer is an exit code and words, never a traceback or a hang.

Each case is a command path from the real parser (plugins' commands included), some of
its options with values drawn from a pool of bad ones (or its default), and a few
``ROLLBOX_*`` variables set to bad values. Only invalid values and defaults are drawn, so
a case never legitimately asks for hours of work. Every path a case may write to is in
the test's own directory (or cannot be created): rollbox runs as root here and makes
the directories it is told to use.

The run is bounded twice: ``CASES`` cases, and no new case after ``BUDGET_S`` seconds.
A failure prints the exact command and environment to reproduce it.
"""

from __future__ import annotations

import argparse
import random
import shlex
import subprocess
import time
from pathlib import Path

import pytest
from cli_support import SCRIPT, cli_env
from rollbox import cli, get_plugin_manager

SEED = 20261201
CASES = 80
BUDGET_S = 300.0
PER_CASE_TIMEOUT_S = 90.0

BAD_NUMBERS = ["-1", "0", "-0", "nan", "inf", "-inf", "1e309", "abc", "", " ", "1,5", "0x10"]
BAD_TEXT = ["", " ", "-", "--", "=", ":", "a=b=c", "BAD_ID!", "Ünïcödé", "x" * 300,
            "$(touch pwned)", "'", "\x01"]

ENV_POOL = {
    "ROLLBOX_BACKEND": ["nonsense", "fake", "kubernetes", "remote", " ", "LOCAL"],
    "ROLLBOX_HOME": ["{scratch}/missing/home", "relative/home", "/etc/hostname/x", "/proc/x",
                     " "],
    "ROLLBOX_SANDBOX_UID": ["abc", "0", "-1", "4294967295", "1e3", "99999999999", " "],
    "ROLLBOX_IMAGE_CAPACITY_GB": ["0", "-1", "abc", "inf", "nan", "1e-12", " "],
    "ROLLBOX_SCRATCH": ["bogus", "relative", "/proc/x", "{scratch}/layers", "memory", "disk",
                        " "],
    "ROLLBOX_BWRAP": ["/bin/true", "/nonexistent", "/etc/hostname", " "],
    "ROLLBOX_K8S_NAMESPACE": ["Bad NS", "x" * 70, " "],
    "ROLLBOX_RUN_ID": ["BAD!", "x" * 40, " "],
    "ROLLBOX_CGROUPS": ["bogus", "on", "off", " "],
    # The remote backend's: addresses on loopback or none (no name lookups, no traffic
    # off this machine), tokens and certificates that cannot work.
    "ROLLBOX_URL": ["http://[::1", "ftp://x", "unix:relative.sock",
                    "unix:{scratch}/missing.sock", "http://127.0.0.1:1", "https://127.0.0.1:1",
                    "http://127.0.0.1:1/path", " "],
    "ROLLBOX_TOKEN": ["", " ", "\x01", "x" * 5000],
    "ROLLBOX_TOKEN_FILE": ["{scratch}/missing", "{scratch}", "{scratch}/file.txt", " "],
    "ROLLBOX_CA": ["{scratch}/file.txt", "{scratch}/missing.pem", "{scratch}", " "],
}

COMMANDS = [["true"], ["echo", "fuzz"], [""], ["sh", "-c", "exit 3"], ["/nonexistent"],
            ["sh", "-c", "echo $ROLLBOX_HOME"], []]

# Commands that legitimately run until stopped (servers) or download (build-image reads
# PyPI): not fuzzed; their argument checks are argparse's and their own tests'.
UNBOUNDED = {("openhands", "serve"), ("openhands", "build-image"), ("serve",)}

# Options whose defaults, not bad values, keep a case short (the bench's workload size).
FORCED = {("bench",): ["--backend", "fake", "--think-ms", "0", "--images", "2", "--rollouts",
                       "1", "--concurrency", "2", "--padding-mb", "0", "--quiet"]}


def _paths(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
           ) -> dict[tuple[str, ...], argparse.ArgumentParser]:
    found = {path: parser}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found.update(_paths(child, (*path, name)))
    return found


def _leaves() -> dict[tuple[str, ...], argparse.ArgumentParser]:
    parser, _ = cli.build_parser(get_plugin_manager())
    paths = _paths(parser)
    return {p: sub for p, sub in paths.items() if p and p not in UNBOUNDED and not any(
        isinstance(a, argparse._SubParsersAction) for a in sub._actions)}


def _value(action: argparse.Action, rng: random.Random, scratch: Path) -> str:
    if action.choices is not None and rng.random() < 0.3:
        return str(rng.choice(list(action.choices)))
    if action.default not in (None, False, [], argparse.SUPPRESS) and rng.random() < 0.3:
        return str(action.default)
    metavar = str(action.metavar or action.dest).lower()
    if any(word in metavar for word in ("path", "json", "plot", "workdir", "kubeconfig",
                                        "image", "ref")):
        return rng.choice([str(scratch / "missing" / "out.json"), str(scratch / "file.txt"),
                           str(scratch), "relative/out", "", "python:3.12",
                           "docker.io/library/python:3.12", str(scratch / "garbage.tar"),
                           "oci:" + str(scratch), "dir:/nonexistent"])
    if any(word in metavar for word in ("host", "url")):
        return rng.choice(["http://127.0.0.1:1", "unix:relative.sock", "http://[::1",
                           "ftp://x", ""])
    return rng.choice(BAD_NUMBERS + BAD_TEXT)


def _case(rng: random.Random, leaves: dict[tuple[str, ...], argparse.ArgumentParser],
          scratch: Path) -> tuple[list[str], dict[str, str]]:
    path = rng.choice(sorted(leaves))
    parser = leaves[path]
    argv = list(path)
    options = [a for a in parser._actions if a.option_strings
               and not isinstance(a, argparse._HelpAction)]
    for action in rng.sample(options, k=min(len(options), rng.randint(0, 3))):
        argv.append(rng.choice(action.option_strings))
        if action.nargs != 0:
            argv.append(_value(action, rng, scratch))
    for action in parser._actions:  # positionals, the command of `run` included
        if action.option_strings or isinstance(action, argparse._SubParsersAction):
            continue
        if action.nargs == argparse.REMAINDER:
            argv += ["--", *rng.choice(COMMANDS)]
        elif rng.random() < 0.9:
            argv.append(_value(action, rng, scratch))
    argv += FORCED.get(path, [])
    if path == ("run",) and "--timeout" not in argv:
        argv[1:1] = ["--timeout", "20"]  # commands from the pool end at once; a bound anyway
    env = {name: rng.choice(values).format(scratch=scratch)
           for name, values in rng.sample(sorted(ENV_POOL.items()), k=rng.randint(0, 2))}
    return argv, env


@pytest.mark.slow
def test_no_traceback_and_no_hang_whatever_is_typed(home: Path, tmp_path: Path) -> None:
    (tmp_path / "file.txt").write_text("not an image\n")
    (tmp_path / "garbage.tar").write_bytes(b"\x00garbage" * 100)
    rng = random.Random(SEED)
    leaves = _leaves()
    started = time.monotonic()
    ran = 0
    for _ in range(CASES):
        if time.monotonic() - started > BUDGET_S:
            break
        argv, env = _case(rng, leaves, tmp_path)
        repro = " ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items()), "rollbox",
                          shlex.join(argv)])
        try:
            result = subprocess.run([str(SCRIPT), *argv], capture_output=True, text=True,
                                    timeout=PER_CASE_TIMEOUT_S, env=cli_env(home, env),
                                    stdin=subprocess.DEVNULL, cwd=tmp_path)
        except subprocess.TimeoutExpired:
            pytest.fail(f"hung for {PER_CASE_TIMEOUT_S}s: {repro}")
        output = result.stdout + result.stderr
        assert "Traceback" not in output, f"{repro}\n{output[-3000:]}"
        if result.returncode == 2:
            assert result.stderr.strip(), f"exit 2 without a word: {repro}"
        ran += 1
    assert ran >= 20, f"only {ran} cases ran within {BUDGET_S}s: the machine is too busy"
