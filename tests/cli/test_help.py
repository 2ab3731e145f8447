"""Every ``rollbox`` subcommand, plugins' included, explains itself: a description, a
help line for each option, and the default wherever there is one."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterator

import pytest
from cli_support import Rollbox
from rollbox import cli, cli_args, get_plugin_manager


def _paths(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
           ) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _paths(child, (*path, name))


PARSER, _ = cli.build_parser(get_plugin_manager())
PATHS = dict(_paths(PARSER))


def test_every_installed_command_is_covered() -> None:
    top = {path[0] for path in PATHS if path}
    assert {"run", "doctor", "images", "k8s"} <= top


@pytest.mark.parametrize("path", list(PATHS), ids=[" ".join(p) or "rollbox" for p in PATHS])
def test_each_command_has_a_description_and_each_option_help(path: tuple[str, ...]) -> None:
    parser = PATHS[path]
    assert parser.description, f"`rollbox {' '.join(path)}` has no description"
    formatter = cli_args.DefaultsFormatter(parser.prog)
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        name = "/".join(action.option_strings) or action.dest
        assert action.help, f"`rollbox {' '.join(path)}`: {name} has no help"
        meaningful = action.default not in (None, False, [], argparse.SUPPRESS)
        if meaningful and action.option_strings:
            text = formatter._get_help_string(action) or ""
            assert "default" in text, f"`rollbox {' '.join(path)}`: {name} hides its default"


@pytest.mark.parametrize("path", list(PATHS), ids=[" ".join(p) or "rollbox" for p in PATHS])
def test_help_runs_and_shows_the_description(rollbox: Rollbox, path: tuple[str, ...]) -> None:
    result = rollbox(*path, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: rollbox")
    first_words = " ".join((PATHS[path].description or "").split()[:4])
    assert first_words in " ".join(result.stdout.split())


HEAVY = ("aiohttp", "kubernetes_asyncio", "gymnasium", "openhands", "nemo_gym", "numpy")


def test_building_the_parser_imports_no_heavy_package() -> None:
    """Every ``rollbox`` command builds the whole parser first: a plugin that imports its
    server or client stack there makes ``rollbox run -- true`` pay for it (aiohttp alone
    took ~0.8 s of a 1.6 s start)."""
    code = ("import sys\nfrom rollbox import cli, get_plugin_manager\n"
            "cli.build_parser(get_plugin_manager())\n"
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip() == "[]", done.stdout
