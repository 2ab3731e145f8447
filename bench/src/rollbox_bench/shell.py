"""The ``shell`` environment: goals stated in words, checked by a shell command.

The agent works in a POSIX shell; after every action the task runs its ``check``
command, and an exit status of 0 means solved: reward 1.0 and the episode terminates.
Otherwise the reward is 0.0 and the episode goes on (until the step limit truncates it).
A ``Task`` subclass that overrides ``setup`` and ``judge``: the pattern of
docs/writing-an-environment.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rollbox.envs import Judgement, StepOutcome, Task
from rollbox.sandbox import Sandbox
from rollbox.spec import SandboxSpec

DEFAULT_WORKDIR = "/tmp"


@dataclass(frozen=True, kw_only=True)
class ShellTask(Task):
    """A goal for a shell session; ``files`` are written (relative to the workdir)
    before the first action."""

    spec: SandboxSpec = field(default_factory=lambda: SandboxSpec(workdir=DEFAULT_WORKDIR))
    check: str
    files: Mapping[str, str] = field(default_factory=dict)
    check_timeout_s: float = 30.0

    async def setup(self, sandbox: Sandbox) -> None:
        for path, text in self.files.items():
            await sandbox.write_file(path, text.encode())

    async def judge(self, sandbox: Sandbox, step: StepOutcome | None) -> Judgement:
        result = await sandbox.exec(self.check, timeout=self.check_timeout_s)
        solved = result.exit_code == 0
        return Judgement(reward=1.0 if solved else 0.0, terminated=solved or step is None,
                         info={"check_exit_code": result.exit_code})


def default_shell_tasks(image: str = "host", workdir: str = DEFAULT_WORKDIR) -> list[ShellTask]:
    """Three small goals; ``reset(seed=...)`` picks among them."""
    spec = SandboxSpec(image=image, workdir=workdir)
    return [
        ShellTask(
            id="shell/hello-file",
            prompt="Create a file named hello.txt in the current directory whose only "
            "content is the line: hello world",
            check='test "$(cat hello.txt 2>/dev/null)" = "hello world"',
            spec=spec,
        ),
        ShellTask(
            id="shell/count-lines",
            prompt="The file words.txt in the current directory holds one word per line. "
            "Write the number of lines it has, and nothing else, to count.txt.",
            check='test "$(tr -d " \\n" < count.txt 2>/dev/null)" = "4"',
            spec=spec,
            files={"words.txt": "sandbox\nreward\nrollout\npolicy\n"},
        ),
        ShellTask(
            id="shell/sorted-copy",
            prompt="Write the lines of fruits.txt (in the current directory), sorted "
            "alphabetically, to sorted.txt.",
            check='printf "apple\\nbanana\\ncherry\\n" | cmp -s - sorted.txt',
            spec=spec,
            files={"fruits.txt": "cherry\napple\nbanana\n"},
        ),
    ]


class ShellTaskSource:
    """The ``shell`` task source (``rollbox/Shell-v0``): a fixed list of shell goals."""

    name = "shell"

    def __init__(
        self,
        tasks: Sequence[ShellTask] | None = None,
        *,
        image: str = "host",
        workdir: str = DEFAULT_WORKDIR,
    ) -> None:
        self._tasks: list[ShellTask] = (
            list(tasks) if tasks is not None else default_shell_tasks(image, workdir)
        )

    def tasks(self) -> Sequence[ShellTask]:
        return self._tasks
