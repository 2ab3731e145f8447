"""Registers the kubernetes backend and the ``rollbox k8s`` commands (entry point group
``rollbox``).

Every ``rollbox`` command loads this module, so it imports nothing heavy: the backend
(kubernetes-asyncio, aiohttp: about two seconds) is registered as a factory that core
calls only when the ``kubernetes`` backend is asked for, and the CLI module is imported
only when ``rollbox k8s`` runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from rollbox.backend import Backend
from rollbox.cli_commands import Command
from rollbox.hookspecs import BackendRef, hookimpl

HELP = "Kubernetes: render manifests, preflight a cluster, reap a run."


def kubernetes_backend() -> type[Backend]:
    """The backend class, imported on first use."""
    from rollbox_kubernetes.backend import KubernetesBackend

    return KubernetesBackend


def _configure(parser: argparse.ArgumentParser) -> None:
    from rollbox_kubernetes import cli

    cli.configure(parser)


def _run(args: argparse.Namespace) -> int:
    from rollbox_kubernetes import cli

    return cli.run(args)


@hookimpl
def rollbox_register_backends(register: Callable[[str, BackendRef], None]) -> None:
    register("kubernetes", kubernetes_backend)


@hookimpl
def rollbox_register_commands(register: Callable[[Command], None]) -> None:
    register(Command("k8s", HELP, _configure, _run))
