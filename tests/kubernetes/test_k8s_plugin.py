"""Loading the plugin (every ``rollbox`` command does) must not import kubernetes-asyncio."""

from __future__ import annotations

import subprocess
import sys

from rollbox.plugins import backend_class, backend_names, get_plugin_manager
from rollbox_kubernetes.backend import KubernetesBackend

PROBE = """
import sys
import rollbox.plugins as p
pm = p.get_plugin_manager()
p.commands(pm)
assert "kubernetes" in p.backend_names(pm)
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("kubernetes_asyncio", "aiohttp"))
print(",".join(heavy))
"""


def test_loading_plugins_imports_no_kubernetes_client() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == ""


def test_backend_resolves_by_name() -> None:
    pm = get_plugin_manager()
    assert "kubernetes" in backend_names(pm)
    assert backend_class(pm, "kubernetes") is KubernetesBackend
