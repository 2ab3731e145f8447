"""Reading claim and pod status: ready yet, failed for good, or still on its way.

Terminal claim reasons are the ``Ready=False`` reasons upstream's claim controller does not
recover from by itself, plus the pod phases that end a sandbox. ``TemplateNotFound`` and
``WarmPoolNotFound`` are not among them: the controller says so too when its cache has not
yet seen a template or pool created a moment before the claim, and tries again (after a
minute, or at the claim's next update). Image pull failures and
unschedulable pods do not show on the claim (its message only says the pod is not
ready), so the backend reads the pod of a slow claim and asks ``pod_problem``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]

TERMINAL_CLAIM_REASONS = frozenset({
    "InvalidMetadata", "EnvVarsInjectionRejected", "VolumeClaimTemplatesError",
    "ClaimExpired", "SandboxExpired", "PodSucceeded", "PodFailed",
})
# Ready=False reasons of a claim whose template or warm pool the controller has not found.
MISSING_DEPENDENCY_REASONS = frozenset({"TemplateNotFound", "WarmPoolNotFound"})
# Ready=False reasons of a Sandbox that will not recover by themselves.
TERMINAL_SANDBOX_REASONS = frozenset({"SandboxExpired", "PodSucceeded", "PodFailed"})
ANNOTATION_POD_NAME = "agents.x-k8s.io/pod-name"
IMAGE_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName",
                           "ErrImageNeverPull"})
CRASH_REASONS = frozenset({"CrashLoopBackOff", "CreateContainerConfigError",
                           "CreateContainerError", "RunContainerError"})


@dataclass(frozen=True)
class ClaimState:
    ready: bool
    terminal: bool
    reason: str
    message: str
    sandbox: str
    missing: bool = False
    """The controller has not found the claim's template or warm pool (yet)."""
    pod_ip: str = ""
    """The pod's IP as the controller copied it into the status (``podIPs``), so that a
    ready sandbox needs no GET of its pod to be reached; "" when not shown (yet)."""


def condition(obj: Obj, kind: str) -> Obj | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def first_ip(ips: Any) -> str:
    """The first address of a status's ``podIPs``: strings in a Sandbox's and a claim's
    status, ``{"ip": …}`` objects in a pod's."""
    for entry in ips if isinstance(ips, list) else []:
        ip = entry.get("ip") if isinstance(entry, dict) else entry
        if isinstance(ip, str) and ip:
            return ip
    return ""


def ip_of_pod(pod: Obj) -> str:
    status = pod.get("status") or {}
    return str(status.get("podIP") or "") or first_ip(status.get("podIPs"))


def claim_state(claim: Obj) -> ClaimState:
    ready = condition(claim, "Ready") or {}
    bound = (claim.get("status") or {}).get("sandbox") or {}
    sandbox = bound.get("name") or ""
    reason = str(ready.get("reason", ""))
    return ClaimState(
        ready=ready.get("status") == "True" and bool(sandbox),
        terminal=ready.get("status") == "False" and reason in TERMINAL_CLAIM_REASONS,
        reason=reason,
        message=str(ready.get("message", "")),
        sandbox=sandbox,
        missing=ready.get("status") == "False" and reason in MISSING_DEPENDENCY_REASONS,
        pod_ip=first_ip(bound.get("podIPs")),
    )


def sandbox_state(sandbox: Obj) -> ClaimState:
    """A directly created Sandbox, read like a claim: ``sandbox`` is its pod's name
    (upstream names the pod after the Sandbox unless an annotation says otherwise)."""
    meta = sandbox.get("metadata") or {}
    pod = (meta.get("annotations") or {}).get(ANNOTATION_POD_NAME) or meta.get("name", "")
    ready = condition(sandbox, "Ready") or {}
    finished = condition(sandbox, "Finished") or {}
    reason = str(ready.get("reason", ""))
    message = str(ready.get("message", ""))
    terminal = ready.get("status") == "False" and reason in TERMINAL_SANDBOX_REASONS
    if finished.get("status") == "True":
        terminal = True
        reason = str(finished.get("reason", "Finished"))
        message = str(finished.get("message", ""))
    return ClaimState(ready=ready.get("status") == "True" and not terminal,
                      terminal=terminal, reason=reason, message=message, sandbox=str(pod),
                      pod_ip=first_ip((sandbox.get("status") or {}).get("podIPs")))


def pod_ready(pod: Obj) -> bool:
    status = pod.get("status") or {}
    ready = condition(pod, "Ready") or {}
    return (status.get("phase") == "Running" and ready.get("status") == "True"
            and bool(ip_of_pod(pod)))


def pod_problem(pod: Obj) -> tuple[str, str] | None:
    """("image" | "unschedulable" | "failed", message) for a pod that will not start."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Failed", "Succeeded"):
        return "failed", f"pod phase {status['phase']}: {status.get('message', '')}".strip()
    for cs in status.get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason", "")
        if reason in IMAGE_REASONS:
            return "image", f"{reason}: {waiting.get('message', '')}".strip()
        if reason in CRASH_REASONS:
            return "failed", f"{reason}: {waiting.get('message', '')}".strip()
    scheduled = condition(pod, "PodScheduled") or {}
    if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        return "unschedulable", str(scheduled.get("message", "Unschedulable"))
    return None


OWN_LIMIT_EVICTIONS = ("exceeds the total limit", "exceeded its local ephemeral storage limit",
                       "emptyDir usage exceeds")
"""The kubelet's eviction messages for a pod past its own ephemeral-storage limits (a node
low on a resource is evicting for the node's sake: not the pod's doing alone)."""


def workload_failure(pod: Obj) -> str | None:
    """Why ``pod`` died of its own workload, or None: evicted past its own storage
    limits, or a container killed past its own memory limit (``OOMKilled``)."""
    status = pod.get("status") or {}
    message = str(status.get("message", ""))
    if status.get("reason") == "Evicted" and any(m in message for m in OWN_LIMIT_EVICTIONS):
        return f"evicted: {message}"
    for cs in status.get("containerStatuses") or []:
        for state in (cs.get("state") or {}, cs.get("lastState") or {}):
            if (state.get("terminated") or {}).get("reason") == "OOMKilled":
                return f"container {cs.get('name', '')} was killed past its memory limit"
    return None
