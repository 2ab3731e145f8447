"""A backend registered as a factory is imported only when it is looked up by name."""

from __future__ import annotations

from collections.abc import Callable

import pluggy
import pytest
from rollbox.errors import PluginError
from rollbox.hookspecs import BackendRef, hookimpl
from rollbox.plugins import backend_class, backend_names, backends, get_plugin_manager
from rollbox.testing.fake import FakeBackend


class LazyPlugin:
    def __init__(self) -> None:
        self.resolved: list[str] = []

    @hookimpl
    def rollbox_register_backends(self, register: Callable[[str, BackendRef], None]) -> None:
        def lazy() -> type[FakeBackend]:
            self.resolved.append("lazy")
            return FakeBackend

        def broken() -> type[FakeBackend]:
            self.resolved.append("broken")
            raise ImportError("No module named 'heavy_sdk'")

        register("lazy", lazy)
        register("broken", broken)


@pytest.fixture
def plugin() -> LazyPlugin:
    return LazyPlugin()


def _pm(plugin: LazyPlugin) -> pluggy.PluginManager:
    pm = get_plugin_manager(load_entrypoints=False)
    pm.register(plugin)
    return pm


def test_names_do_not_resolve_factories(plugin: LazyPlugin) -> None:
    assert {"fake", "lazy", "broken"} <= set(backend_names(_pm(plugin)))
    assert plugin.resolved == []


def test_lookup_resolves_only_the_named_backend(plugin: LazyPlugin) -> None:
    assert backend_class(_pm(plugin), "lazy") is FakeBackend
    assert plugin.resolved == ["lazy"]
    assert backend_class(_pm(plugin), "fake") is FakeBackend
    assert plugin.resolved == ["lazy"]


def test_a_factory_that_cannot_import_is_a_plugin_error(plugin: LazyPlugin) -> None:
    with pytest.raises(PluginError, match=r"'broken' failed to load.*heavy_sdk"):
        backend_class(_pm(plugin), "broken")
    with pytest.raises(PluginError):
        backends(_pm(plugin))
