"""How every ``rollbox`` subcommand parses its arguments, plugins' included.

``CommandParser`` is the parser of ``rollbox`` and, through ``add_subparsers``, of every
subcommand below it, so a plugin's ``configure`` gets the same conventions for free:

- a subcommand's ``help`` is also its ``--help`` description;
- an option's help ends with its default, unless the default is empty or the help
  already says it;
- values are checked as they are parsed (``positive``, ``non_negative``, ``count``,
  ``nonempty``, ``absolute``, ``key_value``), so a bad one is an ``argument --x: ...`` usage error
  naming the option, never an error about some internal field later.
"""

from __future__ import annotations

import argparse
import difflib
import math
import posixpath
from collections.abc import Callable, Sequence
from typing import Any


class DefaultsFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` to an option's help when it has a meaningful default."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        help_text = action.help or ""
        default = action.default
        if (not action.option_strings or "default" in help_text or default is None
                or default is False or default == [] or default is argparse.SUPPRESS):
            return help_text
        return f"{help_text} (default: %(default)s)"


class _SubcommandsAction(argparse._SubParsersAction):  # type: ignore[type-arg]
    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        if "help" in kwargs:
            kwargs.setdefault("description", kwargs["help"])
        parser: argparse.ArgumentParser = super().add_parser(name, **kwargs)
        if isinstance(parser, CommandParser):
            parser.is_subcommand = True
        return parser


def unrecognized(parser: argparse.ArgumentParser, extras: list[str]) -> str:
    """The error for arguments ``parser`` does not take, with the closest option it
    does take for each mistyped one (``--timout``: did you mean ``--timeout``?)."""
    known = [o for o in parser._option_string_actions if o.startswith("--")]
    said = []
    for extra in extras:
        name = extra.split("=", 1)[0]
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        said.append(f"{extra} (did you mean {close[0]}?)"
                    if name.startswith("-") and close else extra)
    return "unrecognized arguments: " + " ".join(said)


class CommandParser(argparse.ArgumentParser):
    """An ArgumentParser whose subcommands follow the conventions above; a subcommand
    refuses an argument it does not take itself, with its own usage and the closest
    option it has (not the top-level usage)."""

    is_subcommand = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)
        self.register("action", "parsers", _SubcommandsAction)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if self.is_subcommand and extras:
            self.error(unrecognized(self, extras))
        return parsed, extras


def _checked(what: str, convert: Callable[[str], Any],
             ok: Callable[[Any], bool]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value

    parse.__name__ = what  # argparse names the type in some messages
    return parse


positive = _checked("a positive number", float, lambda v: 0 < v < math.inf)
"""A finite number above zero (seconds, CPUs, MiB)."""

non_negative = _checked("a number >= 0", float, lambda v: 0 <= v < math.inf)
count = _checked("a whole number >= 0", int, lambda v: v >= 0)
positive_count = _checked("a whole number >= 1", int, lambda v: v >= 1)
fraction = _checked("a number from 0 to 1", float, lambda v: 0 <= v <= 1)
nonempty = _checked("a non-empty string", str, lambda v: bool(v.strip()))
absolute = _checked("an absolute path", posixpath.normpath,
                    lambda v: posixpath.isabs(v) and "\0" not in v)


def key_value(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` with a non-empty key."""
    key, eq, value = text.partition("=")
    if not eq or not key:
        raise argparse.ArgumentTypeError(f"must be KEY=VALUE, got {text!r}")
    return key, value
