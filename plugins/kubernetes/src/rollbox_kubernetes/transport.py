"""Which way a sandbox's commands travel: pod exec through the API server, or the
in-sandbox HTTP runtime (runtime_http.py).

- ``"exec"``: pod exec only.
- ``"http"``: the runtime is required. After the pod is ready, create waits up to
  ``wait_s`` for it to answer and fails with BackendUnavailableError (nothing left
  behind) when it does not.
- ``"auto"`` (default): one probe with a short timeout per sandbox; HTTP when the runtime
  answers, pod exec otherwise. When probes keep timing out (pod IPs are not routable
  from this process, e.g. a laptop outside the cluster), auto stops probing for this
  backend, so creates do not pay for it again.

The runtime is reached at ``http://<pod IP>:<port>``, or through a router or gateway at
``url`` with upstream's headers (``X-Sandbox-ID``, ``X-Sandbox-Namespace``,
``X-Sandbox-Port``, ``X-Sandbox-Pod-IP``; ``X-Sandbox-Timeout`` per request) and a bearer
``token`` when the router wants one. Under either transport, commands with stdin,
streaming, and commands whose timeout exceeds ``max_timeout_s`` (the runtime's own
limit: ``$SANDBOX_EXEC_TIMEOUT_SECONDS``, 300 s by default; unset, every command goes to
the runtime, and one it kills at its limit raises ExecTimeoutError saying so) go through
pod exec.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass

import aiohttp
from rollbox.errors import BackendUnavailableError, InvalidSpecError, SandboxError
from rollbox.sandbox import Endpoint

from rollbox_kubernetes.client import ApiError, KubeClient
from rollbox_kubernetes.resources import PODS
from rollbox_kubernetes.runtime_http import DEFAULT_PORT, RuntimeHttp
from rollbox_kubernetes.sandbox import KubeSandbox
from rollbox_kubernetes.status import ip_of_pod

TRANSPORTS = ("auto", "exec", "http")
_GIVE_UP_AFTER = 3  # auto: consecutive probe timeouts, with no success ever, before giving up


@dataclass(frozen=True)
class TransportOptions:
    transport: str = "auto"
    port: int = DEFAULT_PORT
    url: str | None = None
    token: str | None = None
    probe_timeout_s: float = 0.5
    wait_s: float = 10.0
    max_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if self.transport not in TRANSPORTS:
            raise InvalidSpecError(
                f"kubernetes backend transport must be one of {TRANSPORTS}, got "
                f"{self.transport!r}")


class Transports:
    """A backend's HTTP session and its choice of transport for each new sandbox."""

    def __init__(self, options: TransportOptions, namespace: str) -> None:
        self.options = options
        self.namespace = namespace
        self.stats: Counter[str] = Counter()
        """Runtime requests by endpoint (probe, execute, upload, download)."""
        self._session: aiohttp.ClientSession | None = None
        self._timeouts_in_a_row = 0
        self._ever_answered = False

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            # Idle connections are dropped before the runtime's own keep-alive timeout
            # (uvicorn: 5 s) can close them under a request being sent.
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(keepalive_timeout=2.0, limit=0),
                trust_env=False)
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def attach(self, sandbox: KubeSandbox, client: KubeClient) -> None:
        """Give ``sandbox`` its runtime when it answers (or fail, under ``"http"``)."""
        opts = self.options
        if opts.transport == "exec":
            return
        if opts.transport == "auto" and self._timeouts_in_a_row >= _GIVE_UP_AFTER \
                and not self._ever_answered:
            return
        if not sandbox.pod_ip:
            # Under "http" the IP may lag the sandbox's readiness: wait for it as for the
            # runtime (and for an API server that is restarting, within the create's
            # own timeout, which bounds this call).
            patience = opts.wait_s if opts.transport == "http" else 0.0
            sandbox.pod_ip = await self._pod_ip(client, sandbox.pod, patience)
        runtime = self._runtime_for(sandbox)
        if runtime is not None and await self._probe(runtime):
            sandbox.runtime = runtime
            return
        if opts.transport == "http":
            where = opts.url or f"http://{sandbox.pod_ip or '<no pod IP>'}:{opts.port}"
            why = f" ({runtime.failure})" if runtime is not None and runtime.failure else ""
            raise BackendUnavailableError(
                f"transport='http': the sandbox runtime of pod {sandbox.pod} at {where} "
                f"did not answer or cannot run commands{why} (waited {opts.wait_s}s); the "
                "image must serve agent-sandbox's "
                f"runtime API on port {opts.port} (examples/python-runtime-sandbox), "
                "reachable from this process (run inside the cluster, or pass runtime_url= "
                "a sandbox router); or use transport='auto' or 'exec'")

    def refuse_runtime(self, sandbox: KubeSandbox, error: SandboxError) -> None:
        """``sandbox``'s runtime answered its probe but could not run a real command
        (``error``): under ``"auto"`` its commands go through pod exec from now on; under
        ``"http"`` there is no other way, so BackendUnavailableError says why."""
        if self.options.transport == "http":
            raise BackendUnavailableError(
                f"transport='http': the sandbox runtime of pod {sandbox.pod} cannot run "
                f"rollbox's commands ({error.message}); use transport='auto' or 'exec'"
            ) from error
        sandbox.runtime = None

    def _runtime_for(self, sandbox: KubeSandbox) -> RuntimeHttp | None:
        opts = self.options
        headers: dict[str, str] = {}
        if opts.url is not None:
            url = opts.url
            headers = {"X-Sandbox-ID": sandbox.pod, "X-Sandbox-Namespace": self.namespace,
                       "X-Sandbox-Port": str(opts.port)}
            if sandbox.pod_ip:
                headers["X-Sandbox-Pod-IP"] = sandbox.pod_ip
            if opts.token:
                headers["Authorization"] = f"Bearer {opts.token}"
        elif sandbox.pod_ip:
            host = f"[{sandbox.pod_ip}]" if ":" in sandbox.pod_ip else sandbox.pod_ip
            url = f"http://{host}:{opts.port}"
        else:
            return None
        return RuntimeHttp(self.session(), url, sandbox, headers=headers, stats=self.stats,
                           max_timeout_s=opts.max_timeout_s)

    async def endpoint(self, sandbox: KubeSandbox, client: KubeClient, port: int) -> Endpoint:
        """Where ``port`` of ``sandbox``'s pod is reached: through the router at ``url``
        (its headers name the pod and port), else at the pod's IP, which is routable
        from inside the cluster only. A ``network="none"`` pod's NetworkPolicy denies
        all ingress: expose ports of such pods through a router the policy admits."""
        if self.options.url is not None:
            headers = {"X-Sandbox-ID": sandbox.pod, "X-Sandbox-Namespace": self.namespace,
                       "X-Sandbox-Port": str(port)}
            if sandbox.pod_ip:
                headers["X-Sandbox-Pod-IP"] = sandbox.pod_ip
            if self.options.token:
                headers["Authorization"] = f"Bearer {self.options.token}"
            return Endpoint(self.options.url, headers)
        if not sandbox.pod_ip:
            sandbox.pod_ip = await self._pod_ip(client, sandbox.pod)
        if not sandbox.pod_ip:
            raise BackendUnavailableError(f"pod {sandbox.pod} has no IP to reach port {port} "
                                          "at; pass runtime_url= a sandbox router")
        host = f"[{sandbox.pod_ip}]" if ":" in sandbox.pod_ip else sandbox.pod_ip
        return Endpoint(f"http://{host}:{port}")

    async def _probe(self, runtime: RuntimeHttp) -> bool:
        opts = self.options
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (opts.wait_s if opts.transport == "http" else 0.0)
        while True:
            started = loop.time()
            if await runtime.probe(opts.probe_timeout_s):
                self._ever_answered = True
                self._timeouts_in_a_row = 0
                return True
            timed_out = loop.time() - started >= opts.probe_timeout_s * 0.9
            if loop.time() >= deadline:
                self._timeouts_in_a_row = self._timeouts_in_a_row + 1 if timed_out else 0
                return False
            await asyncio.sleep(min(0.2, max(0.0, deadline - loop.time())))

    async def _pod_ip(self, client: KubeClient, pod: str, patience: float = 0.0) -> str:
        """The pod's IP; "" if it has none within ``patience`` seconds. An API server
        that does not answer (restarting: status 0 or 5xx) is waited for past that."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + patience
        while True:
            unreachable = False
            try:
                obj = await client.get(PODS, self.namespace, pod)
            except ApiError as error:
                obj, unreachable = {}, patience > 0 and (error.status == 0
                                                         or error.status >= 500)
            ip = ip_of_pod(obj)
            if ip or (loop.time() >= deadline and not unreachable):
                return ip
            await asyncio.sleep(0.2)
