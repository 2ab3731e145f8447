"""Text spaces wide enough for what a language model actually writes.

Gymnasium's ``Text`` space accepts only characters of its ``charset`` and defaults to 62
alphanumerics, so a real command (``grep -n "TODO" *.py | head``) or real output (a
traceback with ``→`` or a CJK file name) would fall outside it. Building a ``Text`` over
all of Unicode is no way out either: it indexes every character, which costs seconds and
tens of megabytes per space (and a vector env copies its space per sub-environment).

``UnicodeText`` keeps ``Text``'s sampling over a modest, representative charset (ASCII
printable, whitespace, and a spread of Latin, Greek, Cyrillic, CJK, symbols and emoji),
and widens membership to the rule a sandbox can honour: any ``str`` of allowed length that
has no NUL and can be encoded as UTF-8 (no lone surrogates). NUL cannot cross an argv or
a C string, so a command containing it could not run faithfully anyway.
"""

from __future__ import annotations

import string
from typing import Any

from gymnasium.spaces import Text
from rollbox.envs import is_sandbox_text

SAMPLE_CHARSET: str = "".join(
    dict.fromkeys(
        string.printable  # ASCII letters, digits, punctuation, space, \t \n \r \x0b \x0c
        + "éèàüöäßñçøåÉÜÑ"  # Latin-1 / Latin Extended
        + "αβγδλπσΩΔ"  # Greek
        + "абвгджзЖЯ"  # Cyrillic
        + "中文字符测试日本語한국어"  # CJK
        + "→←✓✗•…“”\u2018\u2019«»€£¥°±\u00d7÷≤≥≠∞"  # punctuation and symbols
        + "😀🚀🔥✨🐍"  # astral-plane emoji
    )
)
"""Characters ``sample()`` draws from; membership is wider (see the module docstring)."""

DEFAULT_MAX_ACTION_CHARS = 16_384
DEFAULT_MAX_OBSERVATION_CHARS = 8_192


class UnicodeText(Text):
    """A ``Text`` space whose members are any NUL-free, UTF-8-encodable string.

    ``sample()`` draws from ``SAMPLE_CHARSET``. Because membership is wider than the
    sampling charset, the space is not flattenable to an index array, and a vector env
    that copies observations through shared memory (``AsyncVectorEnv`` with its default
    ``shared_memory=True``) cannot carry it: pass ``shared_memory=False`` there, or use
    rollbox's own vector env (``gymnasium.make_vec``), which needs neither.
    """

    def __init__(
        self,
        max_length: int,
        *,
        min_length: int = 0,
        sample_charset: str = SAMPLE_CHARSET,
        seed: int | Any | None = None,
    ) -> None:
        super().__init__(max_length, min_length=min_length, charset=sample_charset, seed=seed)

    def contains(self, x: Any) -> bool:
        return (
            isinstance(x, str)
            and self.min_length <= len(x) <= self.max_length
            and is_sandbox_text(x)
        )

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"

    def __eq__(self, other: object, /) -> bool:
        return (
            isinstance(other, UnicodeText)
            and self.min_length == other.min_length
            and self.max_length == other.max_length
            and self.character_set == other.character_set
        )
