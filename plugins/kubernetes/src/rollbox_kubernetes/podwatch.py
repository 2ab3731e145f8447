"""One watch of a run's pods, so that a sandbox knows when its pod is no longer its own.

agent-sandbox's controller makes a Sandbox's pod again, under the same name and empty,
when the pod is deleted (an eviction, a lost node, a person's ``kubectl delete``). Pod
exec and the runtime go by name, so without this a rollout's next command would run in
the new pod as if its files were still there, and what failed after would be scored as
its own. One list+watch of the run's pods (by label, however many sandboxes) tells each
tracked sandbox when its pod (by uid) is deleting, deleted or replaced: the sandbox is
then lost (``KubeSandbox.lost``), or broken by its own workload when the pod's status
says so (``KubeSandbox.broken_by``), and its next call raises accordingly.

A sandbox's pod is known by uid from the first time the watch sees it after the sandbox
was made (the create path reads a claim or Sandbox, not its pod); a pod seen then under
the name but another IP than the sandbox was given is already another pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from rollbox_kubernetes.client import ApiError, KubeClient, Obj, WatchExpired
from rollbox_kubernetes.resources import PODS
from rollbox_kubernetes.status import ip_of_pod, workload_failure

if TYPE_CHECKING:
    from rollbox_kubernetes.sandbox import KubeSandbox

log = logging.getLogger(__name__)

RELIST_AFTER_ERROR_S = 1.0


class PodWatch:
    """The pods of ``label_selector`` in ``namespace``, watched from the first ``track``
    until ``aclose``."""

    def __init__(self, client: KubeClient, namespace: str, label_selector: str) -> None:
        self.client = client
        self.namespace = namespace
        self.label_selector = label_selector
        self._tracked: dict[str, KubeSandbox] = {}  # by pod name
        self._pods: dict[str, Obj] = {}  # the last state seen of each pod, by name
        self._task: asyncio.Task[None] | None = None
        self.stopped_by: str | None = None
        """Why the watch gave up (no leave to list pods): sandboxes are then checked
        only when a command fails, as before."""

    def track(self, sandbox: KubeSandbox) -> None:
        self._tracked[sandbox.pod] = sandbox
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())
        pod = self._pods.get(sandbox.pod)
        if pod is not None:
            self._saw(pod)

    def untrack(self, sandbox: KubeSandbox) -> None:
        if self._tracked.get(sandbox.pod) is sandbox:
            del self._tracked[sandbox.pod]

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tracked.clear()
        self._pods.clear()

    # -- the watch -----------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            try:
                listing = await self.client.list_objects(
                    PODS, self.namespace, label_selector=self.label_selector)
                self._relisted(listing.get("items") or [])
                async for kind, pod in self.client.watch(
                        PODS, self.namespace, label_selector=self.label_selector,
                        resource_version=listing["metadata"]["resourceVersion"]):
                    if kind == "DELETED":
                        self._gone(pod)
                    else:
                        self._saw(pod)
            except WatchExpired:
                continue
            except ApiError as err:
                if err.status in (401, 403):
                    self.stopped_by = f"cannot list and watch pods: {err}"
                    log.warning("pod watch stopped (%s): a replaced pod is found only when "
                                "a command fails; grant list and watch on pods",
                                self.stopped_by)
                    return
                log.warning("pod watch: %s; relisting in %.0f s", err, RELIST_AFTER_ERROR_S)
                await asyncio.sleep(RELIST_AFTER_ERROR_S)

    def _relisted(self, pods: list[Obj]) -> None:
        current = {pod["metadata"]["name"]: pod for pod in pods}
        for name, before in list(self._pods.items()):
            if name not in current:
                self._gone(before)  # deleted while the watch was away
        for pod in pods:
            self._saw(pod)

    def _saw(self, pod: Obj) -> None:
        meta = pod["metadata"]
        name, uid = meta["name"], meta["uid"]
        self._pods[name] = _slim(pod)
        sandbox = self._tracked.get(name)
        if sandbox is None:
            return
        if not sandbox.pod_uid:
            ip = ip_of_pod(pod)
            if sandbox.pod_ip and ip and ip != sandbox.pod_ip:
                self._lose(sandbox, None, f"pod {name} was made again before it was seen")
                return
            sandbox.pod_uid = uid
        if uid != sandbox.pod_uid:
            self._lose(sandbox, None, f"pod {name} was deleted and made again")
        elif meta.get("deletionTimestamp"):
            self._lose(sandbox, pod, f"pod {name} is being deleted")
        elif (pod.get("status") or {}).get("phase") in ("Failed", "Succeeded"):
            self._lose(sandbox, pod, f"pod {name} has ended")

    def _gone(self, pod: Obj) -> None:
        meta = pod["metadata"]
        name = meta["name"]
        if self._pods.get(name, {}).get("metadata", {}).get("uid") == meta["uid"]:
            del self._pods[name]
        sandbox = self._tracked.get(name)
        if sandbox is not None and sandbox.pod_uid == meta["uid"]:
            self._lose(sandbox, pod, f"pod {name} was deleted")

    def _lose(self, sandbox: KubeSandbox, pod: Obj | None, why: str) -> None:
        if sandbox.lost:
            return
        log.info("sandbox %s lost: %s", sandbox.id, why)
        sandbox.lost = True
        if pod is not None:
            sandbox.broken_by = workload_failure(pod)


def _slim(pod: Obj) -> Obj:
    """What the watch reads of a pod again (a run may hold thousands)."""
    meta = pod["metadata"]
    return {"metadata": {key: meta[key] for key in ("name", "uid", "deletionTimestamp")
                         if key in meta},
            "status": pod.get("status") or {}}
