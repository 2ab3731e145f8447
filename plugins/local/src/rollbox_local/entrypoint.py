"""A spec's entrypoint: the long-running service every fresh generation of a sandbox
starts before it is handed out (see ``SandboxSpec.entrypoint``).

It starts with the generation, so a standby generation boots its service while the
sandbox is still in use, and a reset hands over one that is already up. With
``ready_port`` the generation counts as booted only once something accepts connections
on that port inside (asked through the agent, as ``open_port`` does).
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING

from rollbox.errors import CreateFailedError, PortNotOpenError

from rollbox_local.statuspipe import StatusLine

if TYPE_CHECKING:
    from rollbox_local.generation import Generation
    from rollbox_local.sandbox import LocalSandbox

FIRST_POLL_S, MAX_POLL_S = 0.005, 0.1


async def start_entrypoint(sandbox: LocalSandbox, generation: Generation) -> None:
    """Start ``sandbox.spec.entrypoint`` in ``generation`` and wait until it is up.

    Raises CreateFailedError (retryable) when it cannot start, ends before it is ready,
    or is not ready within ``timeouts.create_s``."""
    spec = sandbox.spec
    assert spec.entrypoint is not None
    agent = await generation.start_agent(sandbox)
    request = sandbox.request(list(spec.entrypoint))
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    status_r, status_w = os.pipe2(os.O_CLOEXEC)
    try:
        rid = sandbox.next_request_id()
        await agent.dispatch(rid, {"op": "exec", "id": rid, "argv": list(request.argv),
                                   "env": dict(request.env), "cwd": request.cwd},
                             [null, null, null, status_w])
    except BaseException as exc:
        os.close(status_r)
        if isinstance(exc, OSError):
            raise _failed(sandbox, f"the agent stopped answering ({exc})") from exc
        raise
    finally:
        os.close(null)
        os.close(status_w)
    status = StatusLine(status_r)
    try:
        async with asyncio.timeout(spec.timeouts.create_s):
            await status.started
            if spec.ready_port is not None:
                await _ready(sandbox, generation, spec.ready_port, status)
            elif status.final.done():
                raise _ended(sandbox, status)
    except TimeoutError:
        raise _failed(sandbox, f"not ready on port {spec.ready_port} within "
                               f"{spec.timeouts.create_s}s") from None
    finally:
        status.close()  # the service lives on; nobody reads its status any more


async def _ready(sandbox: LocalSandbox, generation: Generation, port: int,
                 status: StatusLine) -> None:
    poll = FIRST_POLL_S
    while True:
        if status.final.done():
            raise _ended(sandbox, status)
        try:
            conn = await sandbox.files.connect(port, generation.agent)
        except PortNotOpenError:
            await asyncio.sleep(poll)
            poll = min(2 * poll, MAX_POLL_S)
            continue
        conn.close()
        return


def _ended(sandbox: LocalSandbox, status: StatusLine) -> CreateFailedError:
    outcome = status.final.result()
    if outcome is None:
        why = "its helper went away"
    elif outcome.tag == "E":
        why = f"it could not start: {outcome.rest.partition(' ')[2]}"
    else:
        why = f"it exited with {outcome.rest}"
    return _failed(sandbox, why)


def _failed(sandbox: LocalSandbox, why: str) -> CreateFailedError:
    return CreateFailedError(
        f"the entrypoint {list(sandbox.spec.entrypoint or ())!r} of sandbox {sandbox.id}: "
        f"{why}", sandbox_id=sandbox.id)
