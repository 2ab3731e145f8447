"""Plugin discovery: a fresh pluggy manager per call, never a module global.

Plugins are found through the entry-point group ``rollbox``; tests register fakes with
``pm.register(obj)``. ``check_pending()`` runs at creation so a misspelt hook
implementation fails loudly instead of being ignored.

A backend may be registered lazily, as a zero-argument function returning its class, so
a plugin with heavy dependencies costs nothing until that backend is used: every
``rollbox`` command loads every plugin, but resolves only the backend it runs.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import pluggy

from rollbox import hookspecs
from rollbox.errors import PluginError, UnknownBackendError

if TYPE_CHECKING:
    from rollbox.backend import Backend
    from rollbox.cli_commands import Command
    from rollbox.hookspecs import BackendRef
    from rollbox.metrics import Metrics

T = TypeVar("T")


def get_plugin_manager(*, load_entrypoints: bool = True) -> pluggy.PluginManager:
    """A new plugin manager with core's built-in plugins and every installed one."""
    from rollbox import builtin_plugin

    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    pm.register(builtin_plugin, name="rollbox.builtin")
    if load_entrypoints:
        try:
            pm.load_setuptools_entrypoints(hookspecs.PROJECT)
        except Exception as exc:
            raise PluginError(
                f"a rollbox plugin failed to load ({exc!r}); reinstall or uninstall it"
            ) from exc
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginError(f"a rollbox plugin implements an unknown hook: {exc}") from exc
    return pm


def _collect(hook: Callable[..., object], what: str) -> dict[str, T]:
    found: dict[str, T] = {}

    def register(name: str, item: T) -> None:
        if name in found:
            raise PluginError(f"two plugins register the {what} {name!r}; uninstall one")
        found[name] = item

    hook(register=register)
    return found


def _registered_backends(pm: pluggy.PluginManager) -> dict[str, BackendRef]:
    return _collect(pm.hook.rollbox_register_backends, "backend")


def _resolve(name: str, ref: BackendRef) -> type[Backend]:
    """The class behind a registration: the class itself, or what a lazy factory returns."""
    if isinstance(ref, type):
        return ref
    try:
        return ref()
    except ImportError as exc:
        raise PluginError(
            f"the backend {name!r} failed to load ({exc}); reinstall its package"
        ) from exc


def backend_names(pm: pluggy.PluginManager) -> list[str]:
    """Every registered backend's name, sorted, without importing any backend."""
    return sorted(_registered_backends(pm))


def backends(pm: pluggy.PluginManager) -> dict[str, type[Backend]]:
    """Every registered backend class, by name (imports every backend)."""
    return {name: _resolve(name, ref) for name, ref in _registered_backends(pm).items()}


def backend_class(pm: pluggy.PluginManager, name: str) -> type[Backend]:
    """The backend class called ``name``; only that backend is imported."""
    found = _registered_backends(pm)
    if name not in found:
        known = ", ".join(sorted(found)) or "none"
        hint = ' (pip install "rollbox[kubernetes]")' if name == "kubernetes" else ""
        raise UnknownBackendError(f"no backend named {name!r}{hint}; installed: {known}")
    return _resolve(name, found[name])


def pool_policies(pm: pluggy.PluginManager) -> dict[str, type[object]]:
    """Every registered pool policy class, by name."""
    return _collect(pm.hook.rollbox_register_pool_policies, "pool policy")


def task_sources(pm: pluggy.PluginManager) -> dict[str, object]:
    """Every registered task source factory, by name."""
    return _collect(pm.hook.rollbox_register_tasks, "task source")


def commands(pm: pluggy.PluginManager) -> list[Command]:
    found: list[Command] = []
    pm.hook.rollbox_register_commands(register=found.append)
    names = [c.name for c in found]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise PluginError(f"two plugins register the CLI command(s) {sorted(dupes)}")
    return found


def notify(pm: pluggy.PluginManager | None, hook: str, metrics: Metrics | None = None,
           **kwargs: Any) -> None:
    """Call the observer hook ``hook`` of ``pm`` (nothing without one).

    Observers must not break the pool or run that notifies them: one that raises is
    counted (``observer_errors`` in ``metrics``) and reported as a RuntimeWarning.
    """
    if pm is None:
        return
    try:
        getattr(pm.hook, hook)(**kwargs)
    except Exception as exc:
        if metrics is not None:
            metrics.count("observer_errors")
        warnings.warn(f"a {hook} observer raised {exc!r}", RuntimeWarning, stacklevel=3)
