"""NeMo Gym's ``AsyncSandbox`` through its whole life on the rollbox provider.

The provider comes the way a NeMo Gym server gets it: the adapter's shipped YAML and a
server config naming ``sandbox_provider: sandbox`` go through NeMo Gym's own config
parser, ``resolve_provider_config`` / ``resolve_provider_metadata`` resolve the
reference, and ``AsyncSandbox`` builds the provider from the entry point.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
import rollbox_nemo_gym
from nemo_gym.global_config import GlobalConfigDictParser, GlobalConfigDictParserConfig
from nemo_gym.sandbox import (
    AsyncSandbox,
    SandboxSpec,
    SandboxStatus,
    resolve_provider_config,
    resolve_provider_metadata,
)
from omegaconf import OmegaConf
from rollbox.errors import PathOutsideSandboxError, SandboxFileNotFoundError
from rollbox_nemo_gym import RollboxProvider

SERVER_YAML = """
my_env:
  resources_servers:
    my_env:
      entrypoint: app.py
      domain: coding
      sandbox_provider: sandbox
      sandbox_spec:
        workdir: /work
        env: {GREETING: hello}
        metadata: {harness: my_env}
"""


def nemo_gym_config(tmp_path: Path) -> Any:
    """The merged config NeMo Gym's parser makes from the shipped YAML and a server's."""
    server = tmp_path / "my_env.yaml"
    server.write_text(SERVER_YAML)
    initial = OmegaConf.create({"config_paths": [str(rollbox_nemo_gym.CONFIG), str(server)]})
    return GlobalConfigDictParser().parse(GlobalConfigDictParserConfig(
        initial_global_config_dict=initial, skip_load_from_cli=True,
        skip_load_from_dotenv=True, offline=True,
    ))


def sandbox_from_config(tmp_path: Path, **files: str) -> AsyncSandbox:
    config = nemo_gym_config(tmp_path)
    server = config.my_env.resources_servers.my_env
    provider = resolve_provider_config(server.sandbox_provider, config)
    provider["rollbox"]["keep_warm_s"] = 0
    metadata = resolve_provider_metadata(server.sandbox_provider, config)
    wanted = OmegaConf.to_container(server.sandbox_spec, resolve=True)
    assert isinstance(wanted, dict)
    spec = SandboxSpec(workdir=wanted["workdir"], env=wanted["env"],
                       metadata=metadata | wanted["metadata"], files=files)
    return AsyncSandbox(provider, spec)


async def test_a_sandbox_from_yaml_through_its_whole_life(tmp_path: Path) -> None:
    sandbox = sandbox_from_config(tmp_path, **{"notes/a.txt": "relative\n",
                                               "/etc/task.json": '{"id": 7}'})
    await sandbox.start()
    assert isinstance(sandbox._provider, RollboxProvider)
    handle = sandbox._require_handle()
    assert handle.provider_name == "rollbox"
    assert handle.raw.mapped.spec.labels == {"sandbox-api": "rollbox", "harness": "my_env"}

    # files from the spec, relative ones under the workdir
    started = await sandbox.exec("cat notes/a.txt /etc/task.json; pwd")
    assert started.return_code == 0, started
    assert started.stdout == 'relative\n{"id": 7}/work\n'

    # env: the spec's, overridden per command; the command runs in bash
    env = await sandbox.exec('echo "$GREETING $EXTRA $0"', env={"EXTRA": "there"})
    assert env.stdout == "hello there bash\n"
    override = await sandbox.exec('echo "$GREETING"', env={"GREETING": "bye"})
    assert override.stdout == "bye\n"

    # cwd: relative to the workdir, or absolute
    await sandbox.exec("mkdir -p sub/dir")
    assert (await sandbox.exec("pwd", cwd="sub/dir")).stdout == "/work/sub/dir\n"
    assert (await sandbox.exec("pwd", cwd="/tmp")).stdout == "/tmp\n"
    missing = await sandbox.exec("pwd", cwd="/nowhere")
    assert (missing.return_code, missing.error_type) == (1, None)
    assert "/nowhere" in (missing.stderr or "")

    # a non-zero exit is a result; stdout and stderr apart
    failed = await sandbox.exec("echo out; echo err >&2; exit 7")
    assert (failed.return_code, failed.error_type) == (7, None)
    assert (failed.stdout, failed.stderr) == ("out\n", "err\n")
    killed = await sandbox.exec("kill -9 $$")
    assert (killed.return_code, killed.error_type) == (137, None)

    # a timeout is 125/"timeout", kills the command's whole tree, keeps the sandbox
    timed_out = await sandbox.exec("echo partial; sleep 30 & sleep 30", timeout_s=0.5)
    assert (timed_out.return_code, timed_out.error_type) == (125, "timeout")
    assert timed_out.stdout == "partial\n"
    assert "0.5s" in (timed_out.stderr or "")
    after = await sandbox.exec("ps -eo comm | grep -c '^sleep' || true", timeout_s=10)
    assert after.stdout == "0\n"

    # upload and download
    source = tmp_path / "up.bin"
    source.write_bytes(bytes(range(256)) * 10)
    await sandbox.upload(source, "deep/er/up.bin")
    target = tmp_path / "not" / "yet" / "there.bin"
    await sandbox.download("deep/er/up.bin", target)
    assert target.read_bytes() == source.read_bytes()
    with pytest.raises(SandboxFileNotFoundError):
        await sandbox.download("no-such-file", tmp_path / "x")
    with pytest.raises(PathOutsideSandboxError):
        await sandbox.upload(source, "bad\0path")

    assert await sandbox.status() == SandboxStatus.RUNNING
    provider = sandbox._provider
    await sandbox.stop()
    assert await sandbox.status() == SandboxStatus.STOPPED
    assert await provider.status(handle) == SandboxStatus.STOPPED
    await sandbox.stop()  # a second stop is a no-op
    await provider.close(handle)  # and so is a second close
    gone = await provider.exec(handle, "true")
    assert (gone.return_code, gone.error_type) == (125, "sandbox")


def host_file(path: Path, text: str) -> Path:
    """A file the sandbox user could read on the host (its directory is searchable)."""
    path.write_text(text)
    path.parent.chmod(0o755)
    return path


async def test_the_sandbox_is_isolated_from_the_host(tmp_path: Path) -> None:
    secret = host_file(tmp_path / "secret.txt", "host only")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        async with AsyncSandbox({"rollbox": {"keep_warm_s": 0}}, SandboxSpec()) as sandbox:
            await sandbox.start()
            seen = await sandbox.exec(f"cat {secret}; ls -A /root /home 2>&1; hostname")
            assert "host only" not in (seen.stdout or "")
            assert seen.stdout is not None and seen.stdout.endswith("rollbox\n")
            reach = await sandbox.exec(
                f"python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), 2)'"
            )
            assert reach.return_code != 0  # no network: not even the host's loopback
    finally:
        listener.close()


def dash_only_image(root: Path) -> Path:
    """A root filesystem holding dash as /bin/sh, its libraries, and nothing else."""
    dash = Path(shutil.which("dash") or "/bin/dash")
    if not dash.exists():
        pytest.skip("no dash on this machine to build a bash-less image from")
    listed = subprocess.run(["ldd", str(dash)], capture_output=True, text=True, check=True)
    libraries = [Path(word) for line in listed.stdout.splitlines() for word in line.split()
                 if word.startswith("/")]
    for source, target in [(dash, Path("/bin/sh")), *((lib, lib) for lib in libraries)]:
        placed = root / target.relative_to("/")
        placed.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source.resolve(), placed)
    root.parent.chmod(0o755)  # the sandbox user reads the image
    return root


async def test_a_sandbox_without_bash_runs_sh(tmp_path: Path) -> None:
    """``shell: auto`` runs bash where the image has it and sh where it does not."""
    image = dash_only_image(tmp_path / "image")
    provider = {"rollbox": {"keep_warm_s": 0}}
    for _ in range(2):  # the second time it knows: sh at once
        async with AsyncSandbox(provider, SandboxSpec(image=f"dir:{image}")) as sandbox:
            await sandbox.start()
            result = await sandbox.exec("echo $0; exit 3")
            assert (result.stdout, result.return_code) == ("/bin/sh\n", 3)
    async with AsyncSandbox({"rollbox": {"keep_warm_s": 0, "shell": "bash"}},
                            SandboxSpec(image=f"dir:{image}")) as sandbox:
        await sandbox.start()
        result = await sandbox.exec("echo $0")
        assert (result.return_code, result.error_type) == (125, "sandbox")
        assert "bash" in (result.stderr or "")


async def test_many_sandboxes_at_once() -> None:
    provider_config = {"rollbox": {"keep_warm_s": 0}}
    sandboxes = [AsyncSandbox(provider_config, SandboxSpec(env={"N": str(i)})) for i in range(8)]
    await asyncio.gather(*(s.start() for s in sandboxes))
    results = await asyncio.gather(*(s.exec("echo $N") for s in sandboxes))
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(8)]
    ids = {s._require_handle().sandbox_id for s in sandboxes}
    assert len(ids) == 8
    await asyncio.gather(*(s.stop() for s in sandboxes))
