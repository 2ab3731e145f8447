"""Turning a command's result into the observation text an agent reads.

The observation is stdout followed by stderr (as a terminal would interleave them, minus
the interleaving), decoded as UTF-8 with undecodable bytes replaced. Past ``limit``
characters the middle is cut and a marker says how much: the head shows what the
command started with, the tail usually holds the error. NUL becomes U+FFFD so the text
stays inside the observation space.
"""

from __future__ import annotations

from dataclasses import dataclass

from rollbox.sandbox import ExecResult

REPLACEMENT = "\ufffd"


@dataclass(frozen=True)
class Rendered:
    text: str
    chars: int  # length before truncation
    truncated: bool  # cut here, or already capped by the sandbox's output limit


def clean(text: str) -> str:
    """``text`` without NUL or lone surrogates (both cannot cross a sandbox boundary)."""
    text = text.replace("\0", REPLACEMENT)
    return text.encode("utf-8", "replace").decode("utf-8")


def truncate(text: str, limit: int) -> tuple[str, bool]:
    """``text`` cut to at most ``limit`` characters, keeping its head and tail."""
    if len(text) <= limit:
        return text, False
    dropped = len(text) - limit
    while True:
        marker = f"\n[… {dropped} characters truncated …]\n"
        room = limit - len(marker)
        if room < 2:
            return text[:limit], True
        if len(text) - room == dropped:
            break
        dropped = len(text) - room
    head = room // 2
    tail = room - head
    return text[:head] + marker + text[len(text) - tail :], True


def render_result(result: ExecResult, limit: int, *, timed_out: bool = False) -> Rendered:
    text = result.stdout.decode("utf-8", "replace")
    if result.stderr:
        err = result.stderr.decode("utf-8", "replace")
        text = f"{text}\n{err}" if text and not text.endswith("\n") else text + err
    if timed_out:
        text += f"\n[command timed out after {result.duration_s:g}s and was killed]\n"
    text = clean(text)
    cut, truncated = truncate(text, limit)
    return Rendered(cut, len(text), truncated or result.truncated)
