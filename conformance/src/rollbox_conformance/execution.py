"""Exec semantics: exit codes and signals, stdin, output of every shape, env and cwd,
timeouts that kill the whole tree, output caps, and streaming with signals."""

from __future__ import annotations

import asyncio
import contextlib
import signal

import pytest
from rollbox import Backend, OutputChunk, Sandbox
from rollbox.errors import CommandNotFoundError, ExecTimeoutError

from rollbox_conformance.base import BackendTestBase

MiB = 1024 * 1024


class ExecTests(BackendTestBase):
    """``Sandbox.exec`` and ``Sandbox.stream`` behave the same on every backend."""

    # -- exit codes and signals -------------------------------------------------------------

    @staticmethod
    def death_by(backend: Backend, signum: int) -> int:
        """The exit code of a command killed by ``signum``: -N, or the shell-style 128+N
        of backends without ``signal_exit_codes`` (e.g. Kubernetes pod exec)."""
        return -int(signum) if backend.capabilities.signal_exit_codes else 128 + int(signum)

    async def test_exit_codes_of_true_and_false(self, sandbox: Sandbox) -> None:
        assert (await sandbox.exec(["true"], timeout=30)).exit_code == 0
        result = await sandbox.exec(["false"], timeout=30)
        assert result.exit_code == 1
        assert not result.ok

    @pytest.mark.parametrize("code", [2, 42, 255])
    async def test_exit_code_is_reported_exactly(
        self, backend: Backend, sandbox: Sandbox, code: int
    ) -> None:
        self.require(backend, "shell")
        assert (await self.sh(sandbox, f"exit {code}")).exit_code == code

    @pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL, signal.SIGUSR1])
    async def test_death_by_signal_is_a_negative_exit_code(
        self, backend: Backend, sandbox: Sandbox, signum: int
    ) -> None:
        self.require(backend, "shell", "signal_exit_codes")
        result = await self.sh(sandbox, f"kill -{int(signum)} $$; sleep 5")
        assert result.exit_code == -int(signum)

    async def test_missing_program_raises_command_not_found(self, sandbox: Sandbox) -> None:
        with pytest.raises(CommandNotFoundError):
            await sandbox.exec(["/nonexistent-rollbox-conformance/program"], timeout=30)

    # -- stdin and output ---------------------------------------------------------------------

    async def test_stdin_reaches_the_command(self, sandbox: Sandbox) -> None:
        data = b"line one\nline two\n"
        result = await sandbox.exec(["cat"], stdin=data, timeout=30)
        assert result.stdout == data

    async def test_no_stdin_means_immediate_eof(self, sandbox: Sandbox) -> None:
        async with self.within(30, "cat without stdin"):
            result = await sandbox.exec(["cat"], timeout=20)
        assert result.exit_code == 0
        assert result.stdout == b""

    async def test_empty_output(self, sandbox: Sandbox) -> None:
        result = await sandbox.exec(["true"], timeout=30)
        assert (result.stdout, result.stderr) == (b"", b"")
        assert not result.truncated

    async def test_binary_output_round_trips(self, sandbox: Sandbox) -> None:
        data = bytes(range(256)) * 64
        result = await sandbox.exec(["cat"], stdin=data, timeout=30)
        assert result.stdout == data

    async def test_non_utf8_output_is_kept_as_bytes(self, sandbox: Sandbox) -> None:
        data = b"\xff\xfe\x80 not utf-8 \xc3\x28\n"
        result = await sandbox.exec(["cat"], stdin=data, timeout=30)
        assert result.stdout == data
        assert "\ufffd" in result.text

    async def test_huge_output_under_the_cap_is_complete(self, sandbox: Sandbox) -> None:
        data = bytes(range(251)) * (8 * MiB // 251)
        result = await sandbox.exec(["cat"], stdin=data, timeout=60, output_limit=16 * MiB)
        assert len(result.stdout) == len(data)
        assert result.stdout == data
        assert not result.stdout_truncated

    async def test_huge_generated_output(self, backend: Backend, sandbox: Sandbox) -> None:
        self.require(backend, "shell")
        result = await self.sh(sandbox, "head -c 20000000 /dev/zero", output_limit=32 * MiB)
        assert result.exit_code == 0
        assert result.stdout == bytes(20_000_000)

    async def test_stdout_and_stderr_are_kept_apart(
        self, backend: Backend, sandbox: Sandbox
    ) -> None:
        self.require(backend, "shell")
        result = await self.sh(sandbox, "echo to-out; echo to-err >&2; echo more-out")
        assert result.stdout == b"to-out\nmore-out\n"
        assert result.stderr == b"to-err\n"

    async def test_both_streams_full_do_not_deadlock(
        self, backend: Backend, sandbox: Sandbox
    ) -> None:
        self.require(backend, "shell")
        script = "head -c 3000000 /dev/zero >&2; head -c 3000000 /dev/zero; echo end >&2"
        result = await self.sh(sandbox, script, output_limit=8 * MiB)
        assert len(result.stdout) == 3_000_000
        assert result.stderr.endswith(b"end\n")
        assert len(result.stderr) == 3_000_004

    # -- output caps ------------------------------------------------------------------------

    async def test_output_over_the_cap_is_cut_and_flagged(self, sandbox: Sandbox) -> None:
        data = b"0123456789" * 10_000
        result = await sandbox.exec(["cat"], stdin=data, timeout=30, output_limit=1000)
        assert result.stdout_truncated
        assert result.truncated
        assert len(result.stdout) <= 1000
        assert data.startswith(result.stdout)
        assert not result.stderr_truncated

    async def test_output_cap_holds_for_a_generating_command(
        self, backend: Backend, sandbox: Sandbox
    ) -> None:
        self.require(backend, "shell")
        result = await self.sh(
            sandbox, "head -c 50000000 /dev/zero; echo err >&2", output_limit=4096
        )
        assert result.stdout_truncated
        assert len(result.stdout) <= 4096
        assert not result.stderr_truncated

    async def test_stderr_cap_is_flagged_separately(
        self, backend: Backend, sandbox: Sandbox
    ) -> None:
        self.require(backend, "shell")
        result = await self.sh(sandbox, "echo small; head -c 100000 /dev/zero >&2",
                               output_limit=1000)
        assert result.stderr_truncated
        assert not result.stdout_truncated
        assert result.stdout == b"small\n"
        assert len(result.stderr) <= 1000

    # -- env and cwd ------------------------------------------------------------------------

    async def test_env_of_the_call_and_of_the_spec(self, backend: Backend) -> None:
        spec = self.spec.replace(env={**self.spec.env, "RBX_FROM_SPEC": "spec-value"})
        async with await backend.create(spec) as sandbox:
            result = await sandbox.exec(
                ["env"], env={"RBX_FROM_CALL": "call value with spaces"}, timeout=30
            )
        lines = result.text.splitlines()
        assert "RBX_FROM_SPEC=spec-value" in lines
        assert "RBX_FROM_CALL=call value with spaces" in lines

    async def test_call_env_overrides_spec_env(self, backend: Backend) -> None:
        spec = self.spec.replace(env={**self.spec.env, "RBX_WHO": "spec"})
        async with await backend.create(spec) as sandbox:
            result = await sandbox.exec(["env"], env={"RBX_WHO": "call"}, timeout=30)
        lines = result.text.splitlines()
        assert "RBX_WHO=call" in lines
        assert "RBX_WHO=spec" not in lines

    async def test_cwd(self, sandbox: Sandbox) -> None:
        assert (await sandbox.exec(["pwd"], cwd="/tmp", timeout=30)).text == "/tmp\n"
        default = await sandbox.exec(["pwd"], timeout=30)
        assert default.text == self.spec.workdir + "\n"

    # -- timeouts ---------------------------------------------------------------------------

    async def test_timeout_raises_in_time(self, sandbox: Sandbox) -> None:
        async with self.within(0.5 + self.timeout_slack_s, "a timed-out exec"):
            with pytest.raises(ExecTimeoutError) as caught:
                await sandbox.exec(["sleep", "60"], timeout=0.5)
        assert caught.value.timeout_s == 0.5
        assert not caught.value.retryable

    async def test_timeout_keeps_output_so_far(self, backend: Backend, sandbox: Sandbox) -> None:
        self.require(backend, "shell")
        async with self.within(1 + self.timeout_slack_s, "a timed-out exec"):
            with pytest.raises(ExecTimeoutError) as caught:
                await sandbox.exec("echo before; echo oops >&2; sleep 60", timeout=1)
        assert caught.value.stdout == b"before\n"
        assert caught.value.stderr == b"oops\n"

    async def test_timeout_kills_the_whole_tree(self, backend: Backend, sandbox: Sandbox) -> None:
        """Backgrounded children and a daemon (setsid double fork, ignoring SIGTERM and
        holding no pipe) are all dead once the timed-out exec returns."""
        self.require(backend, "shell")
        base = self.scratch("tree")
        script = (
            f"mkdir -p {base} && cd {base} || exit 99\n"
            "sleep 300 & echo $! > background.pid\n"
            "(setsid sh -c 'trap \"\" TERM HUP INT; sleep 300 </dev/null >/dev/null 2>&1 & "
            "echo $! > daemon.pid' &)\n"
            "while [ ! -s daemon.pid ]; do sleep 0.05; done\n"
            "echo started; sleep 300\n"
        )
        async with self.within(3 + self.timeout_slack_s, "a timed-out exec with children"):
            with pytest.raises(ExecTimeoutError) as caught:
                await sandbox.exec(script, timeout=3)
        assert caught.value.stdout == b"started\n", "the tree did not start in time"
        check = (
            f"cd {base} || exit 99\n"
            "for f in background.pid daemon.pid; do\n"
            "  p=$(cat $f) || exit 98; [ -n \"$p\" ] || exit 97\n"
            "  if kill -0 \"$p\" 2>/dev/null && grep -q sleep /proc/$p/cmdline 2>/dev/null;"
            " then echo \"alive $f $p\"; fi\n"
            f"done; cd / && rm -rf {base}; echo checked"
        )
        result = await self.sh(sandbox, check)
        assert result.exit_code == 0, result
        assert result.text == "checked\n", f"survived the timeout: {result.text!r}"

    async def test_a_timeout_kills_exactly_the_timed_out_commands_tree(
        self, backend: Backend, sandbox: Sandbox
    ) -> None:
        """B leaves a daemon and hangs; A, started later, leaves a daemon and ends. B's
        timeout kills B's daemon, and A's lives on: a timeout is not a reset."""
        self.require(backend, "shell")
        base = self.scratch("exact")
        daemon = ("(setsid sh -c 'trap \"\" TERM HUP INT; echo $$ > {pid}.tmp && "
                  "mv {pid}.tmp {pid}; exec sleep 300' </dev/null >/dev/null 2>&1 &)")
        wait = "while [ ! -s {pid} ]; do sleep 0.05; done"
        a_pid, b_pid = f"{base}/a.pid", f"{base}/b.pid"
        b = asyncio.ensure_future(sandbox.exec(
            f"mkdir -p {base} && {daemon.format(pid=b_pid)} && {wait.format(pid=b_pid)} && "
            "sleep 300", timeout=4))
        try:
            async with self.within(4 + self.timeout_slack_s, "B's daemon starting"):
                while (await self.sh(sandbox, f"[ -s {b_pid} ]")).exit_code != 0:
                    assert not b.done(), await b
                    await asyncio.sleep(0.1)
            started = await self.sh(sandbox, f"{daemon.format(pid=a_pid)}; "
                                             f"{wait.format(pid=a_pid)}; echo started")
            assert started.text == "started\n", started
            assert not b.done(), "B ended before its timeout"
            async with self.within(4 + self.timeout_slack_s, "B's timeout"):
                with pytest.raises(ExecTimeoutError):
                    await b
        finally:
            b.cancel()
            await asyncio.gather(b, return_exceptions=True)
        check = (f"for n in a b; do p=$(cat {base}/$n.pid)\n"  # a zombie is dead: no cmdline
                 '  kill -0 "$p" 2>/dev/null && grep -q sleep /proc/$p/cmdline 2>/dev/null '
                 "&& echo $n\ndone; true")
        alive = (await self.sh(sandbox, check)).text.split()
        for _ in range(int(self.timeout_slack_s * 10)):  # B's daemon may take a moment
            if "b" not in alive:
                break
            await asyncio.sleep(0.1)
            alive = (await self.sh(sandbox, check)).text.split()
        assert "b" not in alive, "the timed-out command's daemon survived its timeout"
        assert "a" in alive, "another command's daemon died of B's timeout"
        await self.sh(sandbox, f"kill -9 $(cat {a_pid}); rm -rf {base}")

    async def test_sandbox_usable_after_a_timeout(self, sandbox: Sandbox) -> None:
        async with self.within(0.3 + self.timeout_slack_s, "a timed-out exec"):
            with pytest.raises(ExecTimeoutError):
                await sandbox.exec(["sleep", "60"], timeout=0.3)
        assert (await sandbox.exec(["true"], timeout=30)).ok

    # -- streaming --------------------------------------------------------------------------

    async def test_stream_output_and_exit_code(self, backend: Backend, sandbox: Sandbox) -> None:
        self.require(backend, "streaming")
        async with self.within(30, "a streamed echo"):
            process = await sandbox.stream(["echo", "streamed"], timeout=20)
            chunks = [chunk async for chunk in process]
            code = await process.wait()
        assert code == 0
        assert b"".join(c.data for c in chunks if c.stream == "stdout") == b"streamed\n"
        assert all(isinstance(c, OutputChunk) for c in chunks)

    async def test_a_stream_that_ended_takes_stdin_eof_and_signals_quietly(
        self, backend: Backend, sandbox: Sandbox
    ) -> None:
        """Whoever feeds a command's stdin can lose the race with its end (``rollbox run``
        closes stdin when its own ends): closing stdin or signalling after the command
        ended is not an error, like closing a pipe to a process that exited; writing
        may say BrokenPipeError (an OSError) or be dropped."""
        self.require(backend, "streaming", "signals")
        async with self.within(30, "a stream used after its end"):
            process = await sandbox.stream(["true"], timeout=20)
            assert [chunk async for chunk in process] == []
            assert await process.wait() == 0
            with contextlib.suppress(OSError):
                await process.write_stdin(b"too late\n")
            await process.close_stdin()
            await process.send_signal(int(signal.SIGTERM))
            assert await process.wait() == 0
        assert (await sandbox.exec(["true"], timeout=30)).ok

    @pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
    async def test_stream_signal_ends_the_command(
        self, backend: Backend, sandbox: Sandbox, signum: int
    ) -> None:
        self.require(backend, "streaming", "signals")
        async with self.within(self.timeout_slack_s, "a signalled stream"):
            process = await sandbox.stream(["sleep", "60"], timeout=60)
            await process.send_signal(int(signum))
            code = await process.wait()
        assert code == self.death_by(backend, signum)

    async def test_stream_interleaves_with_a_live_command(
        self, backend: Backend, sandbox: Sandbox
    ) -> None:
        """Output arrives while the command still runs; stdin reaches it; a signal ends it."""
        self.require(backend, "streaming", "signals", "shell")
        script = "echo ready; read line; echo \"got $line\"; sleep 60"
        async with self.within(20 + self.timeout_slack_s, "an interactive stream"):
            process = await sandbox.stream(script, timeout=60)
            seen = b""
            iterator = aiter(process)
            while b"ready\n" not in seen:
                seen += (await anext(iterator)).data
            await process.write_stdin(b"hello\n")
            while b"got hello\n" not in seen:
                seen += (await anext(iterator)).data
            await process.send_signal(signal.SIGTERM)
            code = await process.wait()
        assert code == self.death_by(backend, signal.SIGTERM)
