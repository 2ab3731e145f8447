"""Test support: a Kubernetes API server emulator on loopback with a fake cluster."""

from rollbox_kubernetes.testing.controller import container_runtime
from rollbox_kubernetes.testing.emulator import ApiServerEmulator
from rollbox_kubernetes.testing.shellbox import ShellBackend

__all__ = ["ApiServerEmulator", "ShellBackend", "container_runtime"]
