"""Registers the kubernetes backend and the ``rollbox k8s`` commands (entry point group
``rollbox``)."""

from __future__ import annotations

from collections.abc import Callable

from rollbox.backend import Backend
from rollbox.cli_commands import Command
from rollbox.hookspecs import hookimpl


@hookimpl
def rollbox_register_backends(register: Callable[[str, type[Backend]], None]) -> None:
    from rollbox_kubernetes.backend import KubernetesBackend

    register(KubernetesBackend.name, KubernetesBackend)


@hookimpl
def rollbox_register_commands(register: Callable[[Command], None]) -> None:
    from rollbox_kubernetes import cli

    register(Command("k8s", "Kubernetes: render manifests, preflight a cluster, reap a run.",
                     cli.configure, cli.run))
