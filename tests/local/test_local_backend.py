"""What is specific to the local (bubblewrap) backend and not in the conformance suite:
host networking, images laid over the host, the sandbox's identity files, seccomp, the
agent as an unkillable init, the fate of writable layers, snapshot chains, bad input.

Every test runs real sandboxes on this machine (fixtures in conftest.py).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from rollbox import SandboxSpec
from rollbox.errors import (
    BackendUnavailableError,
    CommandNotFoundError,
    CreateFailedError,
    ImageError,
    ImageNotFoundError,
    ImageStoreFullError,
    InvalidSpecError,
    UnsupportedSpecError,
)
from rollbox.spec import Network, Resources
from rollbox_local import LocalBackend, LocalSandbox
from rollbox_local.generation import boot_generation
from rollbox_local.oci_build import write_oci_layout

HOST = SandboxSpec(image="host")
HOST_PYTHON = os.path.basename(os.path.realpath("/usr/bin/python3"))


def on_host(path: str) -> bool:
    return os.path.lexists(path)


@pytest.fixture
async def sandbox(backend: LocalBackend) -> AsyncIterator[LocalSandbox]:
    sandbox = await backend.create(HOST)
    try:
        yield sandbox
    finally:
        await sandbox.close()


async def eventually(condition: Callable[[], bool], what: str, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within}s: {what}")
        await asyncio.sleep(0.02)


# -- network -------------------------------------------------------------------------------


async def test_network_host_reaches_a_listener_on_host_loopback(backend: LocalBackend) -> None:
    token = secrets.token_hex(8).encode()
    received: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.append(await reader.readline())
        writer.write(token + b"\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    code = (
        "import socket\n"
        f"s = socket.create_connection(('127.0.0.1', {port}), timeout=5)\n"
        "s.sendall(b'hello from inside\\n')\n"
        "print(s.makefile().readline().strip())\n"
    )
    try:
        async with await backend.create(HOST.replace(network=Network.HOST)) as sandbox:
            result = await sandbox.exec(["python3", "-c", code], timeout=20)
    finally:
        server.close()
        await server.wait_closed()
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == token
    assert received == [b"hello from inside\n"]


# -- images ----------------------------------------------------------------------------------


async def test_oci_image_over_host_sees_repo_host_usr_and_image_env(
    backend: LocalBackend, tmp_path: Path
) -> None:
    layout = write_oci_layout(
        tmp_path / "swe-task",
        {"repo/README": b"task repo\n", "repo/run.py": b"print('ran from /repo')\n",
         "repo/bin/check": (b"#!/bin/sh\necho checked $TASK_NAME\n", 0o755)},
        base_host=True,
        env={"TASK_NAME": "astropy-1234", "PYTHONDONTWRITEBYTECODE": "1"},
        workdir="/repo",
    )
    async with await backend.create(SandboxSpec(image=str(layout), workdir="/repo")) as sandbox:
        assert sandbox.base_env == {"TASK_NAME": "astropy-1234", "PYTHONDONTWRITEBYTECODE": "1"}
        listing = await sandbox.exec("ls /repo && cat README && python3 run.py && bin/check")
        assert listing.exit_code == 0, listing.stderr
        assert listing.text.splitlines() == [
            "README", "bin", "run.py", "task repo", "ran from /repo", "checked astropy-1234"]
        # the host's /usr, not a copy: the same python3 as on the host, read-only
        host_python = HOST_PYTHON
        usr = await sandbox.exec("readlink -f /usr/bin/python3; touch /usr/rbx 2>&1; echo $?")
        lines = usr.text.splitlines()
        assert Path(lines[0]).name == host_python
        assert "Read-only file system" in lines[1] and lines[2] == "1"
        # the call's env overrides the image's
        override = await sandbox.exec("echo $TASK_NAME", env={"TASK_NAME": "other"})
        assert override.text == "other\n"


async def test_image_without_a_shell_says_so(backend: LocalBackend, tmp_path: Path) -> None:
    layout = write_oci_layout(tmp_path / "data-only", {"data/answer": b"42"})
    async with await backend.create(SandboxSpec(image=str(layout))) as sandbox:
        with pytest.raises(CommandNotFoundError) as caught:
            await sandbox.exec("echo hi")
        assert "/bin/sh" in caught.value.message
        assert str(layout) in caught.value.message
        assert not caught.value.retryable
        # the image is there all the same, and nothing of the host is
        assert await sandbox.read_file("/data/answer") == b"42"
        with pytest.raises(CommandNotFoundError):
            await sandbox.exec(["/usr/bin/python3", "-c", "pass"])
        assert await sandbox.ping()


# -- the filesystem and identity the sandbox sees --------------------------------------------


async def test_host_system_dirs_are_read_only(sandbox: LocalSandbox) -> None:
    targets = ["/usr/rbx", "/bin/rbx", "/lib/rbx", "/etc/ssl/rbx", "/etc/passwd", "/etc/hosts"]
    script = "".join(f"( : > {t} ) 2>/dev/null && echo WROTE {t}\n" for t in targets)
    result = await sandbox.exec(script + "touch /new-at-root && echo root-writable")
    assert result.text == "root-writable\n", result.text
    # and only in the sandbox's own layer: the host has no such file
    assert not on_host("/new-at-root")


async def test_identity_files_show_only_root_and_nobody(sandbox: LocalSandbox) -> None:
    result = await sandbox.exec(
        "cut -d: -f1 /etc/passwd; echo --; cut -d: -f1 /etc/group; echo --; "
        "id -u; id -un; uname -n; hostname")
    assert result.text.split("--\n") == ["root\nnobody\n", "root\nnogroup\n",
                                          "0\nroot\nrollbox\nrollbox\n"]


async def test_host_private_dirs_are_absent_or_the_sandboxs_own(sandbox: LocalSandbox) -> None:
    """/root and /var/tmp exist (HOME and temp files need them) but start empty: nothing
    of the host's /home, /root, /var, /srv, /opt, /mnt or /work is there."""
    result = await sandbox.exec("for d in /home /root /var /var/tmp /srv /opt /mnt /work; do "
                                "[ -e $d ] && ls -A $d | head -3 | sed \"s|^|$d: |\"; done; "
                                "echo done")
    assert result.text == "/var: tmp\ndone\n", result.text


# -- seccomp, capabilities, no_new_privs -----------------------------------------------------

SECCOMP_PROBE = """\
import ctypes, errno, os, platform
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
KEYCTL = {"x86_64": 250, "aarch64": 219}[platform.machine()]
CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWNET = 0x10000000, 0x00020000, 0x40000000

def errname(ret):
    return "OK" if ret >= 0 else errno.errorcode[ctypes.get_errno()]

# keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, create=1): no privilege needed
print("keyctl", errname(libc.syscall(KEYCTL, 0, -3, 1)))
print("mount", errname(libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)))
for name, flag in (("user", CLONE_NEWUSER), ("mnt", CLONE_NEWNS), ("net", CLONE_NEWNET)):
    print("unshare-" + name, errname(libc.unshare(flag)))
print("getppid", errname(os.getppid()))
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
for key in ("Seccomp", "NoNewPrivs", "CapEff", "CapPrm", "CapBnd", "CapAmb"):
    print(key, status[key].strip())
"""


async def test_seccomp_refuses_keyctl_mount_unshare_with_eperm(sandbox: LocalSandbox) -> None:
    result = await sandbox.exec(["python3", "-c", SECCOMP_PROBE], timeout=20)
    assert result.exit_code == 0, result.stderr
    seen = dict(line.split(" ", 1) for line in result.text.splitlines())
    # keyctl needs no privilege and unshare(CLONE_NEWUSER) would give ENOSPC (bwrap's
    # --disable-userns): EPERM for both can only come from the seccomp filter.
    assert seen == {
        "keyctl": "EPERM", "mount": "EPERM", "unshare-user": "EPERM",
        "unshare-mnt": "EPERM", "unshare-net": "EPERM", "getppid": "OK",
        "Seccomp": "2", "NoNewPrivs": "1", "CapEff": "0" * 16, "CapPrm": "0" * 16,
        "CapBnd": "0" * 16, "CapAmb": "0" * 16,
    }


# -- the agent is the init of the sandbox's pid namespace ------------------------------------


async def test_agent_survives_kill_minus_one_from_inside(sandbox: LocalSandbox) -> None:
    await sandbox.exec("sleep 300 & sleep 301 &")
    generation = sandbox._live()
    await sandbox.exec("kill -9 -1", timeout=20)  # kills its own shell too: any exit code
    after = await sandbox.exec("echo alive; ps -e -o comm=", timeout=20)
    assert after.exit_code == 0 and after.text.startswith("alive\n"), after
    assert "sleep" not in after.text, "kill -9 -1 from inside missed the sandbox's processes"
    assert await sandbox.ping() and sandbox._live() is generation, "the sandbox was replaced"


async def test_agent_survives_pkill_of_python_from_inside(sandbox: LocalSandbox) -> None:
    generation = sandbox._live()
    # the agent is a python process (its command line names _agent.py): both match it
    found = await sandbox.exec(["pgrep", "-f", "_agent.py"])
    assert "1" in found.text.split(), f"the agent should be pid 1 and visible: {found.text!r}"
    await sandbox.exec("pkill -9 -f python; pkill -9 -f _agent.py", timeout=20)
    after = await sandbox.exec(["echo", "alive"], timeout=20)
    assert after.text == "alive\n"
    assert await sandbox.ping() and sandbox._live() is generation, "the sandbox was replaced"


# -- writable layers: reset, close ---------------------------------------------------------------


async def test_stream_close_stdin_right_after_a_write_keeps_the_write(
    sandbox: LocalSandbox,
) -> None:
    """close_stdin is an EOF after what was written, not a discard of what is queued
    (the Kubernetes emulator relays stdin then a close frame back to back)."""
    process = await sandbox.stream(["cat"], timeout=30)
    payload = secrets.token_bytes(256 * 1024)
    await process.write_stdin(payload)
    await process.close_stdin()
    received = b"".join([chunk.data async for chunk in process])
    assert await process.wait() == 0
    assert received == payload


async def test_reset_removes_the_old_layer_in_the_background(backend: LocalBackend) -> None:
    sandbox = await backend.create(HOST)
    await sandbox.exec("mkdir -p /tmp/many && cd /tmp/many && "
                       "for i in $(seq 200); do echo $i > f$i; done")
    old = sandbox._live()
    assert len(list((Path(old.host_upper()) / "tmp" / "many").iterdir())) == 200
    await sandbox.reset()
    fresh = sandbox._live()
    assert fresh.upper != old.upper
    assert not (Path(fresh.host_upper()) / "tmp" / "many").exists()
    await eventually(lambda: not any(p.exists() for p in old.leftovers),
                     "the old generation's layer is deleted")
    assert (await sandbox.exec("ls /tmp")).text == ""
    directory = sandbox.directory
    await sandbox.close()  # its directory goes in the background too
    assert await backend.leftovers() == []  # which waits for background deletions
    assert not directory.exists()


async def test_reset_retires_the_old_generation_off_the_next_commands_path(
        backend: LocalBackend) -> None:
    """Without network the old generation is killed a moment after reset returns (its
    kernel teardown must not land on the next command); with host network at once; a
    close kills a retiring generation at once too."""
    sandbox = await backend.create(HOST)
    await sandbox.exec("sleep 60 & true")
    old = sandbox._live()
    await eventually(lambda: sandbox._standby is not None and sandbox._standby.done(),
                     "the standby generation is ready")
    await sandbox.reset()  # a swap: no wait, so the old generation is still retiring
    assert old.alive and old in sandbox._retiring
    assert (await sandbox.exec("pgrep sleep")).exit_code == 1  # not visible from the fresh one
    await eventually(lambda: not old.alive, "the old generation is killed", within=2.0)
    assert not sandbox._retiring
    await sandbox.exec("true")
    retiring = sandbox._live()
    await sandbox.reset()
    await sandbox.close()
    assert not sandbox._retiring
    await eventually(lambda: not retiring.alive, "close kills the retiring generation")
    assert await backend.leftovers() == []

    networked = await backend.create(HOST.replace(network=Network.HOST))
    await networked.exec("true")
    first = networked._live()
    await networked.reset()
    await asyncio.sleep(0.001)  # the kill is scheduled for the loop's next turn
    assert first not in networked._retiring
    await eventually(lambda: not first.alive, "the old generation is killed")
    await networked.close()


async def test_close_while_a_standby_boots_leaves_nothing(backend: LocalBackend) -> None:
    sandbox = await backend.create(HOST)
    await sandbox.exec("true")  # an exec schedules the boot of the next generation
    while sandbox._standby is None:  # noqa: ASYNC110 (caught within a millisecond of starting)
        await asyncio.sleep(0.001)
    assert not sandbox._standby.done()
    await sandbox.close()
    assert await backend.leftovers() == []
    assert list((backend.state_dir / "sandboxes").iterdir()) == []


async def test_a_cancelled_close_still_stops_every_process(backend: LocalBackend) -> None:
    """A caller cancelled mid-close (a timeout around it, a task group unwinding) must not
    leave the sandbox marked closed with its processes running: the teardown finishes,
    and a second close waits for it (the Kubernetes emulator's shutdown cancelled its
    pods' closes this way, and its backend then waited 2 s per sandbox to kill them)."""
    sandbox = await backend.create(HOST)
    await sandbox.exec("true")
    while sandbox._standby is None:  # noqa: ASYNC110 (caught within a millisecond of starting)
        await asyncio.sleep(0.001)
    assert sandbox._current is not None and sandbox._current.agent is not None
    agent = sandbox._current.agent.pid
    closing = asyncio.ensure_future(sandbox.close())
    await asyncio.sleep(0)  # it has begun: waiting for the standby to finish booting
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    await sandbox.close()
    assert not _exists(f"/proc/{agent}")
    assert await backend.leftovers() == []


def _exists(path: str) -> bool:
    return Path(path).exists()


# -- snapshots and forks -------------------------------------------------------------------------


async def test_snapshot_fork_chain_keeps_files_and_drop_removes_layers(
    backend: LocalBackend,
) -> None:
    snapshots_dir = backend.state_dir / "snapshots"
    first = await backend.create(HOST)
    await first.exec("mkdir -p /work && echo one > /work/a && echo gone > /work/del")
    snap1 = await first.snapshot()
    await first.close()

    second = await backend.fork(snap1)
    await second.exec("echo two > /work/b && rm /work/del && echo changed > /work/a")
    snap2 = await second.snapshot()
    third = await backend.fork(snap2)
    try:
        listing = await third.exec("cd /work && for f in *; do echo $f=$(cat $f); done")
        assert listing.text == "a=changed\nb=two\n"
        async with await backend.fork(snap1) as again:  # the first snapshot is untouched
            listing = await again.exec("cd /work && for f in *; do echo $f=$(cat $f); done")
            assert listing.text == "a=one\ndel=gone\n"
    finally:
        await second.close()
        await third.close()
    layer1, layer2 = Path(snap1.meta["layer"]), Path(snap2.meta["layer"])
    assert layer1.parent.parent == layer2.parent.parent == snapshots_dir
    assert await asyncio.to_thread(lambda: layer1.is_dir() and layer2.is_dir())

    await backend.drop_snapshot(snap2)
    assert not await asyncio.to_thread(layer2.exists)
    with pytest.raises(ImageError, match=snap2.id):
        await backend.fork(snap2)
    await backend.drop_snapshot(snap1)
    assert [p for p in snapshots_dir.rglob("*") if p.name.startswith("snap-")] == []
    await backend.aclose()
    assert await backend.leftovers() == []


async def test_fork_of_a_snapshot_whose_parent_was_dropped_fails_cleanly(
    backend: LocalBackend,
) -> None:
    async with await backend.create(HOST) as sandbox:
        await sandbox.write_file("/tmp/a", b"1")
        parent = await sandbox.snapshot()
    async with await backend.fork(parent) as child:
        await child.write_file("/tmp/b", b"2")
        grandchild = await child.snapshot()
    await backend.drop_snapshot(parent)  # the grandchild snapshot lies on this layer
    with pytest.raises(ImageError, match="gone"):
        await backend.fork(grandchild)
    await backend.drop_snapshot(grandchild)
    assert await backend.leftovers() == []


# -- bad input -------------------------------------------------------------------------------------


async def test_unknown_image_names_the_ref(backend: LocalBackend, tmp_path: Path) -> None:
    for ref in ("no-such-image:1", str(tmp_path / "missing-layout")):
        with pytest.raises(ImageNotFoundError) as caught:
            await backend.create(SandboxSpec(image=ref))
        assert ref in caught.value.message
    assert await backend.leftovers() == []


@pytest.mark.parametrize("make", [
    lambda: SandboxSpec(image=" "),
    lambda: SandboxSpec(workdir="relative/dir"),
    lambda: SandboxSpec(network="bridge"),  # type: ignore[arg-type]
    lambda: SandboxSpec(env={"A=B": "x"}),
    lambda: SandboxSpec(resources=Resources(memory_mb=0)),
    lambda: HOST.replace(output_limit_bytes=-1),
], ids=["blank-image", "relative-workdir", "network", "env-name", "memory", "output-limit"])
def test_invalid_specs_are_refused_before_any_backend(make: Callable[[], object]) -> None:
    with pytest.raises(InvalidSpecError):
        make()


@pytest.mark.parametrize("limits", [{"memory_mb": 10 * 2**20}, {"cpus": 4096.0}],
                         ids=["10-TiB-memory", "4096-cpus"])
def test_a_limit_beyond_the_machine_is_refused_unless_best_effort(
        backend: LocalBackend, limits: dict[str, float]) -> None:
    (name, _), = limits.items()
    with pytest.raises(UnsupportedSpecError, match=f"resources.{name}=.*more than this "
                                                   "machine has.*best_effort"):
        backend.check_spec(SandboxSpec(resources=Resources(**limits)))  # type: ignore[arg-type]
    backend.check_spec(SandboxSpec(resources=Resources(**limits, best_effort=True)))  # type: ignore[arg-type]


async def test_full_image_store_through_create(state_dir: Path, tmp_path: Path) -> None:
    blob = secrets.token_bytes(300_000)  # incompressible: the same size unpacked
    first = write_oci_layout(tmp_path / "first", {"blob": blob}, base_host=True)
    second = write_oci_layout(tmp_path / "second", {"blob": blob[::-1]}, base_host=True)
    backend = LocalBackend(state_dir=state_dir, image_capacity_bytes=500_000)
    try:
        holder = await backend.create(SandboxSpec(image=str(first)))
        with pytest.raises(ImageStoreFullError) as caught:
            await backend.create(SandboxSpec(image=str(second)))
        assert caught.value.retryable
        assert (await holder.exec("wc -c < /blob")).text.strip() == "300000"
        assert backend.live_sandboxes == 1
        await holder.close()  # unpins the first image: the second now evicts it
        async with await backend.create(SandboxSpec(image=str(second))) as sandbox:
            assert await sandbox.read_file("/blob") == blob[::-1]
    finally:
        await backend.aclose()
    assert await backend.leftovers() == []


@pytest.mark.skipif(os.geteuid() != 0, reason="only root maps sandboxes to another uid")
def test_state_dir_the_sandbox_user_cannot_reach_is_refused(state_dir: Path) -> None:
    private = state_dir / "private"  # state_dir itself is world-searchable
    private.mkdir(mode=0o700)
    with pytest.raises(BackendUnavailableError) as caught:
        LocalBackend(state_dir=private / "home")
    assert f"{private} is private (mode 700)" in caught.value.message
    assert "Set state_dir" in caught.value.message  # what was passed, not ROLLBOX_HOME
    assert "ROLLBOX_HOME" not in caught.value.message


@pytest.mark.skipif(os.geteuid() != 0, reason="only root maps sandboxes to another uid")
def test_rollbox_home_the_sandbox_user_cannot_reach_is_named(
        state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    private = state_dir / "private"
    private.mkdir(mode=0o700)
    monkeypatch.setenv("ROLLBOX_HOME", str(private / "home"))
    with pytest.raises(BackendUnavailableError) as caught:
        LocalBackend()
    assert "Set ROLLBOX_HOME" in caught.value.message


async def test_the_zygote_makes_a_generations_directories_and_reports_why_it_cannot(
    backend: LocalBackend,
) -> None:
    """Generation directories are made by the zygote's child as the sandbox user (no
    filesystem call on the event loop); a failure there is a clear CreateFailedError."""
    sandbox = await backend.create(HOST)
    try:
        st = await asyncio.to_thread(os.stat, sandbox._live().host_upper())
        owner = backend.ids or (os.geteuid(), os.getegid())
        assert (st.st_uid, st.st_gid) == owner
        in_the_way = "g7" if backend.scratch.tmpfs_layers else "upper7"
        (sandbox.directory / in_the_way).mkdir()  # in the way of generation 7
        with pytest.raises(CreateFailedError) as caught:
            await boot_generation(sandbox, 7)
        assert "File exists" in caught.value.message and in_the_way in caught.value.message
        assert caught.value.retryable
        await sandbox.reset()  # the sandbox itself is unharmed
        assert (await sandbox.exec("echo ok")).text == "ok\n"
    finally:
        await sandbox.close()


@pytest.mark.parametrize("with_agent", [False, True], ids=["alone", "with its agent"])
async def test_a_generation_bwrap_cannot_set_up_says_why(
    backend: LocalBackend, with_agent: bool,
) -> None:
    """bwrap fails after it has said its child's pid (a lower layer is gone). Booted
    with its agent, the agent's first process is what waits for bwrap and sees it go:
    the error still carries bwrap's own reason, not the agent's."""
    sandbox = await backend.create(HOST)
    lowers = sandbox.lowers
    try:
        sandbox.lowers = (Path("/nonexistent-lower-layer"), *lowers)
        with pytest.raises(CreateFailedError) as caught:
            await boot_generation(sandbox, 7, agent=with_agent)
        assert "Can't find source path /nonexistent-lower-layer" in caught.value.message
        sandbox.lowers = lowers
        await sandbox.reset()
        assert (await sandbox.exec("echo ok")).text == "ok\n"
    finally:
        sandbox.lowers = lowers
        await sandbox.close()
