"""A CLI subcommand as plugins register it (see ``rollbox_register_commands``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    """``configure`` adds arguments to the subcommand's parser; ``run`` returns the exit
    code."""

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
