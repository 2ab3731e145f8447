"""The OpenHands adapter's end-to-end tests, in environments of their own.

OpenHands needs Python >= 3.12 and about 200 packages, and its two halves pin different
SDKs (openhands-ai 1.11 pins openhands-sdk 1.34), so there are two environments:

- ``openhands-sdk``: openhands-sdk / -workspace 1.58 — SDK conversations over the SDK's
  own APIRemoteWorkspace and over RollboxWorkspace;
- ``openhands-app``: openhands-ai 1.11 — the unmodified app server with RUNTIME=remote.

Both run against real agent-servers in real rollbox sandboxes, built from PyPI by
``rollbox openhands build-image`` (cached next to the environments).
"""

from __future__ import annotations

import pytest
from isolated_env import EnvRecipe, cache_root, ensure_env, run_pytest_in

pytestmark = pytest.mark.slow

ROLLBOX = ("core", "plugins/local", "plugins/remote", "serve", "adapters/openhands")
SDK_RECIPE = EnvRecipe(
    name="openhands-sdk", python="3.12",
    requirements=("openhands-sdk==1.58.2", "openhands-workspace==1.58.2",
                  "openhands-agent-server==1.58.2", "openhands-tools==1.58.2", "httpx>=0.27"),
    editable=ROLLBOX)
APP_RECIPE = EnvRecipe(
    name="openhands-app", python="3.12",
    requirements=("openhands-ai==1.11.0", "httpx>=0.27"),
    editable=ROLLBOX)


@pytest.fixture(autouse=True)
def _image_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLBOX_OPENHANDS_IMAGE_CACHE", str(cache_root() / "openhands-images"))
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def test_sdk_conversations_on_rollbox() -> None:
    run_pytest_in(ensure_env(SDK_RECIPE), ["adapters/openhands/tests/test_sdk.py"])


def test_app_server_on_rollbox() -> None:
    run_pytest_in(ensure_env(APP_RECIPE), ["adapters/openhands/tests/test_app_server.py"])
