"""The code blocks of rollbox's documentation, and how each one is tested.

Every fenced block in ``README.md``, ``CONTRIBUTING.md`` and ``docs/**/*.md`` (a new
document is picked up by being there) names a language, and the language decides:

- ``python``: run as a script (``python block.py``);
- ``sh``, ``bash``: run as a bash script with ``set -euo pipefail``;
- ``console``: the lines starting with ``$ `` (and their ``\\`` continuations) run as in
  ``sh``; the other lines are sample output and are not compared;
- anything else (``text`` for output, diagrams and listings; ``toml``, ``yaml``, ``json``,
  ``jsonc``, ``ini``, ``dockerfile``): data, never run.

Blocks run in order, one document at a time, in one scratch directory with a fresh
``ROLLBOX_HOME``, this checkout's virtualenv first on ``PATH`` (as after ``source
.venv/bin/activate``, so ``rollbox`` and ``uv run ...`` both work) and links to the
checkout's ``examples/`` and ``benchmarks/``: a later block sees the files an earlier one
wrote. A block passes when it exits 0.

An HTML comment on the lines right above a fence changes that (invisible on GitHub):

- ``<!-- doc-test: skip REASON -->``: do not run it; the reason is required and says why
  it cannot run here (a cluster, a GPU, it is the test suite itself);
- ``<!-- doc-test: slow -->``: it takes long: the document's test is marked ``slow``;
- ``<!-- doc-test: file PATH -->``: write the block to ``PATH`` in the scratch directory
  instead of running it (a plugin module, a test file, a pyproject a later block uses);
- ``<!-- doc-test: excerpt PATH -->``: the block quotes ``PATH`` (a checkout file that a
  test runs, e.g. under ``examples/``): each of its lines must be there, in order
  (indentation and trailing ``#`` comments aside; a line with ``...`` elides).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

RUN_LANGUAGES = frozenset({"python", "sh", "bash", "console"})
DATA_LANGUAGES = frozenset({"text", "toml", "yaml", "json", "jsonc", "ini", "dockerfile"})

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<lang>[^\s`]*)[^`]*$")
_DIRECTIVE = re.compile(r"^\s*<!--\s*doc-test:\s*(?P<verb>\S+)\s*(?P<arg>.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    document: Path
    line: int
    """1-based line of the opening fence."""
    language: str
    code: str
    skip: str | None = None
    """Why it is not run (None: it runs)."""
    slow: bool = False
    file: str | None = None
    """Where to write it instead of running it."""
    excerpt: str | None = None
    """The checkout file it quotes, instead of running it."""

    @property
    def where(self) -> str:
        return f"{self.document.relative_to(REPO)}:{self.line}"

    @property
    def runs(self) -> bool:
        return (self.skip is None and self.file is None and self.excerpt is None
                and self.language in RUN_LANGUAGES)


def documents() -> list[Path]:
    """Every document whose blocks are tested."""
    found = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").rglob("*.md"))]
    return [path for path in found if path.is_file()]


class DocumentError(ValueError):
    """A block or directive the convention above does not allow."""


def blocks(document: Path) -> list[Block]:
    """The fenced blocks of ``document``, with their directives applied."""
    lines = document.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        indent, fence, language = match["indent"], match["fence"], match["lang"]
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        if end == len(lines):
            raise DocumentError(f"{document.name}:{i + 1}: a fence that never closes")
        body = [line[len(indent):] if line.startswith(indent) else line.lstrip()
                for line in lines[i + 1:end]]
        found.append(_block(document, i + 1, language, "\n".join(body) + "\n",
                            _directives(lines, i)))
        i = end + 1
    return found


def _directives(lines: list[str], fence_index: int) -> list[tuple[str, str]]:
    out = []
    j = fence_index - 1
    while j >= 0 and (match := _DIRECTIVE.match(lines[j])):
        out.append((match["verb"], match["arg"]))
        j -= 1
    return out


def _block(document: Path, line: int, language: str, code: str,
           directives: list[tuple[str, str]]) -> Block:
    where = f"{document.relative_to(REPO)}:{line}"
    if not language:
        raise DocumentError(f"{where}: a fence without a language (use text for output, "
                            "diagrams and listings)")
    if language not in RUN_LANGUAGES | DATA_LANGUAGES:
        raise DocumentError(f"{where}: unknown language {language!r}; known: "
                            f"{', '.join(sorted(RUN_LANGUAGES | DATA_LANGUAGES))}")
    skip, slow, file, excerpt = None, False, None, None
    for verb, arg in directives:
        if verb == "skip":
            if not arg:
                raise DocumentError(f"{where}: doc-test: skip needs a reason")
            skip = arg
        elif verb == "slow" and not arg:
            slow = True
        elif verb == "file" and arg and not Path(arg).is_absolute() and ".." not in arg:
            file = arg
        elif verb == "excerpt" and arg and (REPO / arg).is_file():
            excerpt = arg
        else:
            raise DocumentError(f"{where}: unknown directive doc-test: {verb} {arg}")
    if (skip or slow) and language not in RUN_LANGUAGES:
        raise DocumentError(f"{where}: a {language} block never runs: skip/slow mean nothing")
    return Block(document, line, language, code, skip=skip, slow=slow, file=file,
                 excerpt=excerpt)


def console_script(code: str) -> str:
    """The commands of a ``console`` block (``$ `` lines and their continuations)."""
    commands: list[str] = []
    continuing = False
    for line in code.splitlines():
        if continuing or line.startswith("$ "):
            commands.append(line if continuing else line[2:])
            continuing = line.endswith("\\")
    return "\n".join(commands) + "\n"


def missing_from(excerpt: str, source: str) -> str | None:
    """The first line of ``excerpt`` not found in ``source`` in order (None: all are)."""
    def norm(line: str) -> str:
        return " ".join(line.split("  #", 1)[0].split())

    lines = [norm(line) for line in source.splitlines()]
    at = 0
    for line in excerpt.splitlines():
        wanted = norm(line)
        if not wanted or "..." in wanted:
            continue
        try:
            at = lines.index(wanted, at) + 1
        except ValueError:
            return line
    return None
