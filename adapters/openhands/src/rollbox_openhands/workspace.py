"""``RollboxWorkspace``: an OpenHands SDK workspace whose agent-server runs in a rollbox
sandbox, taken warm from this process's pool (Python >= 3.12, ``rollbox[openhands]``).

    from openhands.sdk import Conversation
    from rollbox_openhands.workspace import RollboxWorkspace

    with RollboxWorkspace(image="openhands-agent-server:1.58.2") as workspace:
        conversation = Conversation(agent=agent, workspace=workspace)
        ...

It is a ``RemoteWorkspace``, so ``Conversation`` runs the agent loop in the sandbox's
agent-server (a RemoteConversation), as with OpenHands' Docker or API workspaces. No
server is needed: the process runs rollbox itself (``rollbox_openhands.engine``). To
share warm agent-servers between processes, run ``rollbox serve --face openhands`` and use the
SDK's own ``APIRemoteWorkspace`` pointed at it instead.
"""

from __future__ import annotations

from typing import Any

try:
    from openhands.sdk.workspace import RemoteWorkspace
    from pydantic import Field, PrivateAttr
except ImportError as exc:  # pragma: no cover - depends on the environment
    from rollbox.errors import MissingExtraError

    raise MissingExtraError("RollboxWorkspace (the OpenHands SDK, Python >= 3.12)",
                            "openhands") from exc

from rollbox.spec import Network

from rollbox_openhands.agent_servers import DEFAULT_PORT
from rollbox_openhands.engine import engine
from rollbox_openhands.image import LAUNCHER
from rollbox_openhands.runtime_api import Runtime, StartRequest


class RollboxWorkspace(RemoteWorkspace):
    """A remote workspace on a rollbox sandbox: provisioned on construction, released
    (reset in place for the next one) on ``cleanup()`` / exit."""

    image: str = Field(default="openhands-agent-server:1.58.2",
                       description="rollbox image with the agent-server "
                                   "(`rollbox openhands build-image`)")
    working_dir: str = Field(default="/workspace",
                             description="Working directory inside the sandbox")
    host: str = Field(default="", description="Set to the agent-server's URL once it runs")
    environment: dict[str, str] = Field(default_factory=dict,
                                        description="Environment of the agent-server")
    keep_warm: int = Field(default=1, ge=0,
                           description="booted agent-servers kept ready for the next one")
    forward: list[int] = Field(
        default_factory=list,
        description="ports of this host's 127.0.0.1 reachable at the same port inside the "
                    "sandbox (the LLM's, when it runs here); the sandbox has no other network")
    network: str = Field(default="none",
                         description='"none" (default) or "host": the sandbox shares the '
                                     "host's network (a cloud LLM)")

    _runtime: Runtime | None = PrivateAttr(default=None)

    def model_post_init(self, context: Any) -> None:
        servers = engine(warm=self.keep_warm)
        # The process's engine is shared: the latest workspace's settings apply to the
        # agent-servers booted from now on.
        servers.servers.network = Network(self.network)
        servers.servers.forward.update({p: ("127.0.0.1", p) for p in self.forward})
        request = StartRequest(image=self.image, working_dir=self.working_dir,
                               command=(LAUNCHER, "--port", str(DEFAULT_PORT)),
                               environment=dict(self.environment))
        runtime = servers.run(servers.servers.start(request))
        self._runtime = runtime
        servers.run(servers.servers.wait(runtime))
        if runtime.status != "running":
            self.cleanup()
            raise RuntimeError(f"the agent-server did not start in a rollbox sandbox: "
                               f"{runtime.error or runtime.status}")
        self.host = runtime.url
        self.api_key = runtime.session_api_key
        self.reset_client()
        super().model_post_init(context)

    @property
    def sandbox_id(self) -> str | None:
        """The rollbox sandbox the agent-server runs in."""
        return self._runtime.sandbox_id if self._runtime else None

    def pause(self) -> None:
        """Freeze the sandbox's processes (see ``AgentServers.pause``)."""
        if self._runtime is not None:
            servers = engine()
            servers.run(servers.servers.pause(self._runtime))

    def resume(self) -> None:
        if self._runtime is not None:
            servers = engine()
            servers.run(servers.servers.resume(self._runtime))

    def cleanup(self) -> None:
        """Give the sandbox back (reset in place for the next workspace). Idempotent."""
        runtime, self._runtime = self._runtime, None
        if runtime is not None:
            servers = engine()
            servers.run(servers.servers.stop(runtime))

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        self.cleanup()
