"""The built-in synthetic SWE-style task source (``synthetic``).

Task ``i`` is an image holding a small git repository at ``/repo``: ``solution.py`` with
a bug and ``test_solution.py`` that fails on it (its cases in ``cases.json``), one commit
on ``main``, plus ``padding_bytes`` of seeded random bytes outside the repository so that
hydrating the image costs something real. Images are OCI image layouts, based on the
host's root filesystem (for ``python3``), written by ``rollbox_local.oci_build``; the
image reference is the layout's path.

**The image does not hold its answer.** No fixed ``solution.py`` is anywhere in it (no
branch, ref, stash or object: ``tests/bench/test_synthetic.py`` walks every object), and
the cases that decide the reward are hidden: the task's ``judge_files`` bring
``test_hidden.py`` (other inputs than ``cases.json``) from the host for the final
verdict, which runs on the image with only ``solution.py`` carried over (``answer``), so
nothing else the rollout wrote (an interpreter in ``/usr/bin``, say) takes part.

The scripted policy of each task reads ``README.md`` (its first command, the one TTFC
times), runs the tests (they fail) and applies a candidate patch (the right one with
probability ``p_correct``, seeded per task and rollout); the runner's verdict then runs
the hidden tests: reward 1.0 if they pass. Between two actions it "thinks" for a seeded
time around ``think_s`` (see ``ThinkTime``), standing in for the policy model's
inference, during which the sandbox is idle. Everything is deterministic for a seed.

For the fake backend, ``fake_backend()`` returns a ``FakeBackend`` with the same files
and a handler that evaluates the test run in-process, so runners and the bench are
testable in milliseconds.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import random
import shlex
import shutil
import struct
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollbox.envs import Task
from rollbox.errors import MissingExtraError, UsageError
from rollbox.paths import default_home
from rollbox.results import RolloutOutput
from rollbox.sandbox import ExecRequest, ExecResult, Sandbox
from rollbox.spec import MiB, SandboxSpec, Timeouts
from rollbox.testing.fake import FakeBackend, FakeSandbox, builtin_handler

REPO = "/repo"
TEST_COMMAND = "python3 -B test_solution.py"
HIDDEN_TEST = "test_hidden.py"
VERDICT_COMMAND = f"python3 -B {HIDDEN_TEST}"
PROMPT = (
    "Task {id}. The git repository in {workdir} has a bug: its tests fail. Run them with "
    f"`{TEST_COMMAND}`, fix solution.py so that they pass, then run `submit`."
)
DEFAULT_IMAGES = 8
PADDING_PATH = "/opt/rollbox-synthetic/padding.bin"

_TEST_SOURCE = """\
import json
import sys

from solution import solve

with open("cases.json") as f:
    cases = json.load(f)
bad = [(x, want, solve(x)) for x, want in cases if solve(x) != want]
for x, want, got in bad:
    print(f"FAIL solve({x}) = {got}, want {want}")
print(f"{len(cases) - len(bad)}/{len(cases)} passed")
sys.exit(1 if bad else 0)
"""


_HIDDEN_SOURCE = """\
import sys

from solution import solve

CASES = {cases!r}
bad = [(x, want) for x, want in CASES if solve(x) != want]
print(f"{{len(CASES) - len(bad)}}/{{len(CASES)}} hidden cases passed")
sys.exit(1 if bad else 0)
"""


def _solution(a: int, b: int) -> bytes:
    return f"def solve(x):\n    return x * {a} + {b}\n".encode()


@dataclass(frozen=True)
class Problem:
    """One synthetic task's content (deterministic for seed and index)."""

    index: int
    a: int
    b: int
    buggy: bytes
    fixed: bytes
    wrong: bytes
    cases: tuple[tuple[int, int], ...]
    hidden_cases: tuple[tuple[int, int], ...] = ()
    """What decides the reward: inputs ``cases`` does not show, never in the image."""

    @classmethod
    def make(cls, seed: int, index: int) -> Problem:
        rng = random.Random(f"rollbox-synthetic:{seed}:{index}")
        a, b = rng.randint(2, 97), rng.randint(1, 997)
        xs = rng.sample(range(-50, 50), 4)
        hidden = rng.sample(sorted(set(range(-500, 500)) - set(xs)), 4)
        return cls(index, a, b, buggy=_solution(a, b + 1), fixed=_solution(a, b),
                   wrong=_solution(a, -b), cases=tuple((x, a * x + b) for x in xs),
                   hidden_cases=tuple((x, a * x + b) for x in hidden))

    def judge_files(self) -> dict[str, bytes]:
        """What the final verdict brings into the repository (never in the image)."""
        cases = [list(case) for case in self.hidden_cases]
        return {HIDDEN_TEST: _HIDDEN_SOURCE.format(cases=cases).encode()}

    def repo_files(self) -> dict[str, bytes]:
        """Working-tree files of ``/repo`` (relative paths), as on branch ``main``."""
        return {
            "README.md": f"Synthetic task {self.index}: make the tests pass.\n".encode(),
            "cases.json": json.dumps([list(c) for c in self.cases]).encode() + b"\n",
            "solution.py": self.buggy,
            "test_solution.py": _TEST_SOURCE.encode(),
        }

    def passes(self, solution: bytes) -> bool:
        """What the test run decides for a given ``solution.py`` (no exec of code)."""
        return solution == self.fixed


class SyntheticSource:
    """``n_images`` SWE-style tasks. ``kind`` is ``local`` (OCI layouts under ``root``)
    or ``fake`` (in-memory images for ``FakeBackend``)."""

    name = "synthetic"

    def __init__(
        self,
        n_images: int = 16,
        *,
        seed: int = 0,
        padding_bytes: int = 1 * MiB,
        p_correct: float = 0.5,
        kind: str = "local",
        root: str | Path | None = None,
        test_timeout_s: float = 30.0,
        think_s: float = 0.0,
    ) -> None:
        if n_images < 1:
            raise UsageError(f"synthetic source needs n_images >= 1, got {n_images}")
        if padding_bytes < 0:
            raise UsageError("padding_bytes must be >= 0")
        if not 0.0 <= p_correct <= 1.0:
            raise UsageError(f"p_correct must be within [0, 1], got {p_correct}")
        if kind not in ("local", "fake"):
            raise UsageError(f"synthetic source kind must be 'local' or 'fake', got {kind!r}")
        if kind == "local" and root is None:
            raise UsageError("the local synthetic source needs root=<directory for images>")
        self.n_images = n_images
        self.seed = seed
        self.padding_bytes = padding_bytes
        self.p_correct = p_correct
        self.kind = kind
        self.root = Path(root) if root is not None else None
        self.test_timeout_s = test_timeout_s
        self.think = ThinkTime(think_s, seed)
        self.problems = [Problem.make(seed, i) for i in range(n_images)]
        self._padding: dict[int, bytes] = {}

    @property
    def corpus_bytes(self) -> int:
        """Approximate size of all images' own content (padding dominates)."""
        return sum(self.padding_bytes + 4096 for _ in self.problems)

    def image_ref(self, problem: Problem) -> str:
        if self.kind == "fake":
            return f"synthetic-{self.seed}-{problem.index}"
        assert self.root is not None
        return str(self.root / f"task-{problem.index:05d}")

    def tasks(self) -> Iterator[Task]:
        for problem in self.problems:
            spec = SandboxSpec(
                image=self.image_ref(problem), workdir=REPO,
                timeouts=Timeouts(exec_s=self.test_timeout_s),
                labels={"rollbox.source": self.name, "rollbox.task": str(problem.index)},
            )
            task_id = f"synthetic-{problem.index:05d}"
            yield Task(
                id=task_id, spec=spec, prompt=PROMPT.format(id=task_id, workdir=REPO),
                policy=ScriptedPolicy(problem, self.p_correct, self.seed, self.think),
                verifier=run_hidden_tests, meta={"source": self.name},
                judge_files=problem.judge_files(), answer=("solution.py",),
            )

    # -- image content -----------------------------------------------------------------

    def image_files(self, problem: Problem) -> dict[str, bytes]:
        """Every file of the image (absolute paths), git metadata and padding included."""
        repo = problem.repo_files()
        files = {f"{REPO}/{k}": v for k, v in repo.items()}
        files.update({f"{REPO}/{k}": v for k, v in git_repository(repo).items()})
        if self.padding_bytes:
            files[PADDING_PATH] = self._padding_of(problem)
        return files

    def _padding_of(self, problem: Problem) -> bytes:
        """The image's seeded random padding. Fake images live in memory: their padding
        is made once, and every fake backend of this source (one per bench arm) shares
        it rather than holding a copy of its own. Local images are written to disk once,
        so theirs is not kept."""
        if problem.index in self._padding:
            return self._padding[problem.index]
        rng = random.Random(f"rollbox-synthetic-padding:{self.seed}:{problem.index}")
        padding = rng.randbytes(self.padding_bytes)
        if self.kind == "fake":
            self._padding[problem.index] = padding
        return padding

    def build(self) -> list[Path]:
        """Write every image as an OCI layout under ``root`` (skipping complete ones)."""
        if self.kind != "local" or self.root is None:
            raise UsageError("build() writes local images; this source is kind='fake'")
        try:
            from rollbox_local.oci_build import write_oci_layout
        except ImportError:
            raise MissingExtraError("building the synthetic local images", "local") from None
        paths = []
        for problem in self.problems:
            dest = Path(self.image_ref(problem))
            marker = dest / ".rollbox-complete"
            if not _is_file_with(marker, _fingerprint(self) + "\n"):
                if dest.exists():  # half-written, or an older corpus's: never reused
                    shutil.rmtree(dest)
                write_oci_layout(dest, self.image_files(problem), base_host=True,
                                 env={"PYTHONDONTWRITEBYTECODE": "1"}, workdir=REPO)
                marker.write_text(_fingerprint(self) + "\n")
            paths.append(dest)
        return paths

    def fake_backend(self, **options: Any) -> FakeBackend:
        """A FakeBackend holding these images, whose handler simulates the test run."""
        if self.kind != "fake":
            raise UsageError("fake_backend() needs a source built with kind='fake'")
        images = {self.image_ref(p): self.image_files(p) for p in self.problems}
        by_image = {self.image_ref(p): p for p in self.problems}

        async def handler(sandbox: FakeSandbox, request: ExecRequest) -> ExecResult:
            problem = by_image.get(sandbox.spec.image)
            command = _shell(request)
            hidden = sandbox.files.get(f"{REPO}/{HIDDEN_TEST}")
            if problem is None or command not in (TEST_COMMAND, VERDICT_COMMAND) or (
                    command == VERDICT_COMMAND and hidden != problem.judge_files()[HIDDEN_TEST]):
                return await builtin_handler(sandbox, request)
            solution = sandbox.files.get(f"{REPO}/solution.py", b"")
            ok = problem.passes(solution)
            total = len(problem.cases)
            out = f"{total if ok else 0}/{total} passed\n".encode()
            return ExecResult(0 if ok else 1, stdout=out)

        return FakeBackend(handler, images=images, **options)


def synthetic_source(
    *,
    n_images: int = DEFAULT_IMAGES,
    seed: int = 0,
    padding_bytes: int = 0,
    kind: str = "local",
    root: str | Path | None = None,
    **options: Any,
) -> SyntheticSource:
    """The registered ``synthetic`` environment: its local images built on first use
    under ``$ROLLBOX_HOME/synthetic-gym`` (once), or in memory with ``kind="fake"``
    (pair it with ``fake_backend(n_images, seed)``)."""
    if kind == "local" and root is None:
        root = default_home() / "synthetic-gym" / f"seed-{seed}-padding-{padding_bytes}"
    source = SyntheticSource(n_images, seed=seed, padding_bytes=padding_bytes, kind=kind,
                             root=root, **options)
    if kind == "local":
        source.build()
    return source


def fake_backend(n_images: int = DEFAULT_IMAGES, seed: int = 0, **options: Any) -> FakeBackend:
    """A FakeBackend holding the fake synthetic images of ``synthetic_source(kind="fake")``
    with the same ``n_images`` and ``seed``."""
    return SyntheticSource(n_images, seed=seed, padding_bytes=0, kind="fake").fake_backend(
        **options)


CORPUS_VERSION = 2
"""Bumped when what an image holds changes (2: no answer in it), so that images built
by an older rollbox are rebuilt rather than reused."""


def _fingerprint(source: SyntheticSource) -> str:
    return f"version={CORPUS_VERSION} seed={source.seed} padding={source.padding_bytes}"


def _is_file_with(path: Path, text: str) -> bool:
    try:
        return path.read_text() == text
    except OSError:
        return False


def _shell(request: ExecRequest) -> str:
    argv = list(request.argv)
    if argv[:2] == ["/bin/sh", "-c"] and len(argv) == 3:
        return argv[2]
    return shlex.join(argv)


async def run_hidden_tests(sandbox: Sandbox, task: Task) -> float:
    """The verifier: 1.0 if the hidden tests pass (the final verdict brings them:
    ``Task.judge_files``), else 0.0."""
    return 1.0 if (await sandbox.exec(VERDICT_COMMAND, cwd=REPO)).ok else 0.0


class ThinkTime:
    """Seeded stand-in for the policy model's inference time between two actions.

    In agentic RL every action waits for the model's next turn, generated on a GPU, so a
    sandbox is idle between its commands. Durations are log-normal (sigma 0.5: right-
    skewed, like generation lengths) with mean ``mean_s``; ``mean_s == 0`` means none
    (actions back to back). Each (task, rollout, step) draws from its own seeded stream,
    so durations do not depend on scheduling.
    """

    SIGMA = 0.5

    def __init__(self, mean_s: float = 0.0, seed: int = 0) -> None:
        if not (isinstance(mean_s, int | float) and math.isfinite(mean_s) and mean_s >= 0):
            raise UsageError(f"think time must be a finite number >= 0 s, got {mean_s!r}")
        self.mean_s = float(mean_s)
        self.seed = seed

    def draw(self, task: int, rollout: int, step: int) -> float:
        """Seconds to think before action ``step`` (1-based) of a rollout."""
        if self.mean_s == 0:
            return 0.0
        rng = random.Random(f"rollbox-synthetic-think:{self.seed}:{task}:{rollout}:{step}")
        mu = math.log(self.mean_s) - self.SIGMA**2 / 2
        return rng.lognormvariate(mu, self.SIGMA)

    async def pause(self, task: int, rollout: int, step: int) -> None:
        seconds = self.draw(task, rollout, step)
        if seconds > 0:
            await asyncio.sleep(seconds)


class ScriptedPolicy:
    """Run the tests, apply a candidate patch (right with probability p), thinking
    (``ThinkTime``) before every action but the first. The reward is not its to say:
    the runner takes the task's verdict (the hidden tests) once it returns."""

    def __init__(self, problem: Problem, p_correct: float, seed: int,
                 think: ThinkTime | None = None) -> None:
        self.problem = problem
        self.p_correct = p_correct
        self.seed = seed
        self.think = think or ThinkTime(0.0, seed)

    def right_patch(self, index: int) -> bool:
        rng = random.Random(f"rollbox-synthetic-policy:{self.seed}:{self.problem.index}:{index}")
        return rng.random() < self.p_correct

    async def __call__(self, sandbox: Sandbox, task: Task, index: int) -> RolloutOutput:
        # The first command is the environment's reset (read the task statement), run as
        # soon as the sandbox is there; the model thinks before each later action.
        statement = await sandbox.exec(["cat", "README.md"], cwd=REPO)
        think = self.think.pause
        n = self.problem.index
        await think(n, index, 1)
        before = await sandbox.exec(TEST_COMMAND, cwd=REPO)
        right = self.right_patch(index)
        patch = self.problem.fixed if right else self.problem.wrong
        await think(n, index, 2)
        await sandbox.write_file(f"{REPO}/solution.py", patch)
        await think(n, index, 3)  # the model's last turn: it decides to submit
        return RolloutOutput(reward=1.0 if right else 0.0, info={
            "read_task": statement.ok, "failing_before": not before.ok,
            "patch": "right" if right else "wrong",
        })


# -- a git repository written by hand (no git binary needed at build time) ------------

_EPOCH = "1700000000 +0000"
_AUTHOR = "rollbox <synthetic@rollbox.invalid>"


def git_repository(files: Mapping[str, bytes]) -> dict[str, bytes]:
    """A ``.git`` directory (relative paths) with one commit, ``main`` = ``files``, and an
    index matching its tree; its only objects are that commit's. Deterministic."""
    objects: dict[str, bytes] = {}

    def put(kind: str, body: bytes) -> bytes:
        raw = f"{kind} {len(body)}\0".encode() + body
        digest = hashlib.sha1(raw).digest()
        hexd = digest.hex()
        objects[f".git/objects/{hexd[:2]}/{hexd[2:]}"] = zlib.compress(raw, 6)
        return digest

    def tree(content: Mapping[str, bytes]) -> tuple[bytes, dict[str, bytes]]:
        blobs = {name: put("blob", data) for name, data in content.items()}
        body = b"".join(f"100644 {n}\0".encode() + blobs[n] for n in sorted(blobs))
        return put("tree", body), blobs

    def commit(tree_id: bytes, parent: bytes | None, message: str) -> bytes:
        lines = [f"tree {tree_id.hex()}"]
        if parent is not None:
            lines.append(f"parent {parent.hex()}")
        lines += [f"author {_AUTHOR} {_EPOCH}", f"committer {_AUTHOR} {_EPOCH}", "", message]
        return put("commit", ("\n".join(lines) + "\n").encode())

    main_tree, blobs = tree(files)
    main = commit(main_tree, None, "Add solve() and its tests (the tests fail)")
    out = dict(objects)
    out[".git/HEAD"] = b"ref: refs/heads/main\n"
    out[".git/config"] = (b"[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n"
                          b"\tbare = false\n")
    out[".git/refs/heads/main"] = main.hex().encode() + b"\n"
    out[".git/index"] = _git_index({n: (blobs[n], len(files[n])) for n in files})
    return out


def _git_index(entries: Mapping[str, tuple[bytes, int]]) -> bytes:
    """A version-2 git index with zeroed stat data (git re-hashes such files once)."""
    body = b"DIRC" + struct.pack(">II", 2, len(entries))
    for name in sorted(entries):
        sha, size = entries[name]
        encoded = name.encode()
        entry = struct.pack(">10I", 0, 0, 0, 0, 0, 0, 0o100644, 0, 0, size) + sha
        entry += struct.pack(">H", min(len(encoded), 0xFFF)) + encoded
        entry += b"\0" * (8 - len(entry) % 8)
        body += entry
    return body + hashlib.sha1(body).digest()
