from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import yaml
from rollbox.cli import main
from rollbox.spec import SandboxSpec
from rollbox_kubernetes import KubernetesBackend
from rollbox_kubernetes.testing import ApiServerEmulator

BackendFactory = Callable[..., KubernetesBackend]


def test_render_prints_applyable_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["k8s", "render", "--image", "a:1", "--image", "b:2", "--runtime-class",
                 "gvisor", "--run-id", "demo", "--namespace", "rl"])
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert code == 0
    assert [d["kind"] for d in docs].count("SandboxWarmPool") == 2
    assert all(d["metadata"]["namespace"] == "rl" for d in docs)


async def _cli(*argv: str) -> int:
    return await asyncio.to_thread(main, list(argv))


async def test_preflight_reports_missing_crds_and_permissions(
        emulator: ApiServerEmulator, capsys: pytest.CaptureFixture[str]) -> None:
    assert await _cli("k8s", "preflight", "--host", emulator.url) == 0
    emulator.crds = False
    emulator.forbidden.add(("create", "pods/exec"))
    assert await _cli("k8s", "preflight", "--host", emulator.url) == 1
    out = capsys.readouterr().out
    assert "[FAIL] CRD sandboxclaims.extensions.agents.x-k8s.io" in out
    assert "[FAIL] can create pods/exec: denied" in out


async def test_reap_deletes_only_its_own_run(make_backend: BackendFactory,
                                             emulator: ApiServerEmulator,
                                             spec: SandboxSpec) -> None:
    mine, theirs = make_backend(run_id="mine"), make_backend(run_id="theirs")
    await mine.create(spec)
    kept = await theirs.create(spec)
    assert await _cli("k8s", "reap", "--host", emulator.url, "--run-id", "mine") == 0
    await asyncio.sleep(0.05)
    left = {o["metadata"]["labels"].get("rollbox.dev/run")
            for (plural, _, _), o in emulator.store.objects.items()
            if plural in ("sandboxclaims", "sandboxwarmpools", "sandboxtemplates",
                          "sandboxes", "networkpolicies")} - {None}
    assert left == {"theirs"}
    assert (await kept.exec("echo alive")).stdout == b"alive\n"
