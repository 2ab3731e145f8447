"""A burst of TASKS x ROLLOUTS on a real control plane (tests/cluster: kube-apiserver,
etcd, kube-controller-manager, kube-scheduler, the agent-sandbox controller, kwok with
ten fake nodes, pods backed by real local sandboxes by the node agent), side by side:

- ``rollbox``: KubernetesBackend with the policy ``rollbox bench`` uses (``lookahead``:
  warm the next tasks within a budget, one sandbox per task reused by reset across its
  rollouts), each task its own spec, commands over the in-sandbox HTTP runtime;
- ``sdk``: upstream's Python client ``k8s-agent-sandbox`` as documented: a SandboxClaim
  per rollout on a warm pool (one pool, sized to the concurrency: the SDK has no way to
  warm per-task pools), the command through the runtime at the pod IP, the claim deleted
  after; threads for concurrency (the sync client; its async extra pins an older
  kubernetes-asyncio than rollbox's);
- ``pods``: raw pods, one per rollout (KubernetesBackend ``mode="pod"``, no pool).

Each arm gets a fresh cluster. Every rollout runs one command. What is measured comes
from the API server's audit log (every request: user, verb, resource, time) and from
/proc (CPU of kube-apiserver and etcd during the burst):

- creations/rollout: Sandbox and bare pod creations by anyone (the controller makes the
  Sandboxes of warm pools); pods created by anyone;
- API writes/rollout: the workload's own writes (create, update, patch, delete), and
  all writes by everyone (controller, scheduler, node agent, garbage collector);
- peak API requests/s: the most requests the server received within one second;
- request→ready: from asking for a sandbox to holding a ready one (rollbox: the pool's
  ``queue_wait``; sdk: ``create_sandbox``; pods: ``queue_wait``), mean / p99 / max;
- accounted: succeeded + failed == requested;
- with ``--pulls``: every task has an image of its own (1.2-3 GB, a SWE corpus's sizes)
  and the nodes pull them (the node agent's image model: ``--disk-gb`` per node, 200
  MB/s shared by a node's pulls, one at a time as ``serializeImagePulls``, a modelled
  second lasting ``--time-scale`` real seconds). The rollbox arm plans images
  (``image_planning=True``: prepulls ahead of the runner's queue, placement where the
  image is); raw pods pull on demand where the scheduler puts them. From the kubelet's
  events: ``critical_path_pulls``, the sandbox pods that waited for a pull (prepull pods
  not counted), and ``pull_wait_s``, each sandbox pod's wait for its image in modelled
  seconds (0 when it was there); ``--lead S``: the burst is expected (``Pool.expect``,
  as a training loop says what its next step needs while this one runs) S seconds
  before it starts (raw pods have no use for it); prepull pods are counted apart
  (``prepull_pods_per_rollout``), not as creations;
- left behind: SandboxClaims, Sandboxes and pods still in the namespace once the cluster
  has had ``--drain-wait`` seconds to delete them (deletion is asynchronous: garbage
  collection removes a deleted warm pool's pods after it); ``drained_s`` is how long that
  took.

    uv run python benchmarks/bench_kubernetes_scale.py --tasks 250 --rollouts 4
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import contextlib
import json
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rollbox import NoPoolPolicy, Pool, PoolPolicy, Sandbox
from rollbox.envs import Task
from rollbox.metrics import summarize
from rollbox.policies import LookaheadPolicy
from rollbox.results import RolloutOutput
from rollbox.runner import run_rollouts
from rollbox.spec import Network, SandboxSpec, Timeouts
from rollbox_kubernetes import KubernetesBackend, render
from rollbox_kubernetes.testing.controlplane import WORKLOAD_USER, ControlPlane
from rollbox_kubernetes.testing.fixtures import cluster_binaries

ARMS = ("rollbox", "sdk", "pods")
PULL_ARMS = ("rollbox", "pods")
"""With --pulls: the SDK warms one pool of one template, so it cannot serve a corpus of
per-task images from warm sandboxes at all."""
GB = 1_000_000_000
WRITES = frozenset({"create", "update", "patch", "delete", "deletecollection"})
ROOT = Path(__file__).resolve().parent.parent


def spec_for(i: int, *, pulls: bool = False) -> SandboxSpec:
    """Task ``i``'s spec: its own pool key (as each SWE task has its own image), and with
    ``pulls`` its own image too."""
    return SandboxSpec(image=task_image(i) if pulls else "host", workdir="/work",
                       env={"TASK": str(i)}, network=Network.NONE, reset_command="true",
                       timeouts=Timeouts(create_s=900))


def task_image(i: int) -> str:
    return f"bench.pulls/task-{i}"


def image_bytes(i: int) -> int:
    """Task ``i``'s image size: spread evenly over 1.2-3 GB (fixed, so runs compare)."""
    return int((1.2 + 1.8 * ((i * 37) % 100) / 99) * GB)


def corpus(tasks: int) -> dict[str, int]:
    return {task_image(i): image_bytes(i) for i in range(tasks)}


async def one_command(sandbox: Sandbox, task: Task, index: int) -> RolloutOutput:
    result = await sandbox.exec(["echo", "step"])
    return RolloutOutput(reward=1.0 if result.stdout == b"step\n" else 0.0)


@contextlib.contextmanager
def cluster(args: argparse.Namespace) -> Iterator[ControlPlane]:
    state = Path(tempfile.mkdtemp(prefix="rollbox-scale-"))
    state.chmod(0o711)
    pulls = [f"--image-disk-gb={args.disk_gb}", "--pull-mb-per-s=200",
             f"--time-scale={args.time_scale}"] if args.pulls else []
    plane = ControlPlane(cluster_binaries(ROOT), state, audit=True,
                         nodes=[f"rollbox-node-{i}" for i in range(args.nodes)],
                         agent_args=[f"--max-starting={args.agent_starting}", *pulls])
    plane.start()
    if args.pulls:
        plane.image_manifest.write_text(json.dumps(
            {image: {"bytes": size, "runs_as": "host"}
             for image, size in corpus(args.tasks).items()}))
    try:
        yield plane
    finally:
        plane.stop()
        if args.keep:
            print(f"kept {state}")
        else:
            shutil.rmtree(state, ignore_errors=True)


async def run_rollbox(arm: str, plane: ControlPlane, kubeconfig: str,
                      args: argparse.Namespace) -> dict[str, Any]:
    concurrency = args.concurrency
    planning: dict[str, Any] = {}
    if args.pulls and arm == "rollbox":
        planning = {"image_planning": True, "image_disk_bytes": int(args.disk_gb * GB),
                    "image_sizes": corpus(args.tasks)}
    backend = KubernetesBackend(kubeconfig=kubeconfig, namespace=plane.namespace,
                                run_id=f"bench-{arm}", mode="pod" if arm == "pods" else "claim",
                                transport="http", qps=args.qps, burst=args.burst,
                                adaptive_pacing=args.adaptive_pacing,
                                runtime_wait_s=args.runtime_wait, **planning)
    tasks = [Task(f"t{i}", spec_for(i, pulls=args.pulls), policy=one_command)
             for i in range(args.tasks)]
    policy: PoolPolicy
    if arm == "pods":
        policy, lookahead, cap = NoPoolPolicy(), 0, concurrency
    else:  # as `rollbox bench` runs its rollbox arm
        budget = concurrency
        policy, lookahead, cap = LookaheadPolicy(budget=budget), 2 * concurrency + budget, \
            concurrency + budget
    async with backend:
        pool = Pool(backend, policy=policy, max_sandboxes=cap)
        try:
            if args.lead:  # what one training step of lead gives: the next step expected
                pool.expect([task.spec for task in tasks])
                await asyncio.sleep(args.lead)
                pool.expect([])  # the runner's own queue names them from here on
            report = await run_rollouts(pool, tasks, args.rollouts, concurrency=concurrency,
                                        lookahead=lookahead, rollout_timeout_s=900)
        finally:
            await pool.close()
    ready = pool.metrics.samples.get("queue_wait", [])
    counters = pool.metrics.counters
    return {"requested": report.requested, "succeeded": report.succeeded,
            "failed": report.failed, "failed_by_kind": report.failed_by_kind,
            "accounted": report.accounted, "ready_s": ready,
            # What the pool saw besides the rollouts' own results: a create that failed
            # and was made again, a sandbox quarantined or evicted, each costs a creation.
            "pool": {"creations": counters["creations"], "reuses": counters["reuses"],
                     "evictions": counters["evictions"],
                     "sandbox_failures": pool.metrics.failures_by_kind(),
                     "quarantined": [q.reason for q in pool.quarantined]},
            "planning": dict(backend.hydration.counts) if backend.hydration else {}}


@contextlib.contextmanager
def loopback_names_only() -> Iterator[None]:
    """The SDK falls back to ``<sandbox>.<ns>.svc.cluster.local`` when a Sandbox shows no
    pod IP; looking that up would ask the host's resolver, off this machine. Refuse such
    names here instead (the rollout then fails and is counted)."""
    real = socket.getaddrinfo

    def guarded(host: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and host.endswith(".cluster.local"):
            raise socket.gaierror(f"{host}: not resolved by this benchmark (loopback only)")
        return real(host, *args, **kwargs)

    socket.getaddrinfo = guarded
    try:
        yield
    finally:
        socket.getaddrinfo = real


def run_sdk(plane: ControlPlane, kubeconfig: str, args: argparse.Namespace) -> dict[str, Any]:
    from k8s_agent_sandbox import SandboxClient
    from k8s_agent_sandbox.models import SandboxInClusterConnectionConfig
    from kubernetes import config as k8s_config

    options = render.KubeOptions(namespace=plane.namespace, run_id="bench-sdk", keepalive=())
    spec = spec_for(0)
    objects = [render.template(spec, options),
               render.warm_pool(spec, options, replicas=args.concurrency)]
    plane.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(
        {"apiVersion": "v1", "kind": "List", "items": objects}).encode())
    pool_name = objects[1]["metadata"]["name"]
    plane.kubectl("wait", f"sandboxwarmpool/{pool_name}", "-n", plane.namespace,
                  f"--for=jsonpath={{.status.readyReplicas}}={args.concurrency}",
                  "--timeout=900s", timeout_s=960)
    api = k8s_config.new_client_from_config(config_file=kubeconfig)
    sdk = SandboxClient(connection_config=SandboxInClusterConnectionConfig(), api_client=api)
    ready: list[float] = []
    failures: collections.Counter[str] = collections.Counter()

    def rollout(_: int) -> bool:
        started = time.monotonic()
        try:
            sandbox = sdk.create_sandbox(warmpool=pool_name, namespace=plane.namespace,
                                         sandbox_ready_timeout=900)
        except Exception as exc:
            failures[type(exc).__name__] += 1
            return False
        ready.append(time.monotonic() - started)
        try:
            result = sandbox.commands.run("echo step")
            ok = result.stdout == "step\n" and result.exit_code == 0
            if not ok:
                failures["wrong output"] += 1
            return ok
        except Exception as exc:
            failures[type(exc).__name__] += 1
            return False
        finally:
            with contextlib.suppress(Exception):
                sandbox.terminate()

    n = args.tasks * args.rollouts
    with loopback_names_only(), \
            concurrent.futures.ThreadPoolExecutor(args.concurrency) as threads:
        outcomes = list(threads.map(rollout, range(n)))
    plane.kubectl("delete", "-n", plane.namespace, f"sandboxwarmpool/{pool_name}",
                  f"sandboxtemplate/{pool_name}", "--wait=false")
    api.close()
    succeeded = sum(outcomes)
    return {"requested": n, "succeeded": succeeded, "failed": n - succeeded,
            "failed_by_kind": dict(failures), "accounted": len(outcomes) == n,
            "ready_s": ready}


def read_audit(plane: ControlPlane, since: str) -> list[dict[str, Any]]:
    """The audit events received at or after ``since`` (an RFC 3339 timestamp)."""
    events = []
    with contextlib.suppress(FileNotFoundError), plane.audit_log.open() as lines:
        for line in lines:
            event = json.loads(line)
            if event.get("requestReceivedTimestamp", "") >= since:
                events.append(event)
    return events


def created(event: dict[str, Any]) -> bool:
    """An object was created: a create the server answered 2xx. A create answered 409
    AlreadyExists (a retried create of a fixed name; the controller's second try at a
    pod its cache had not shown it yet) is a write but made nothing."""
    code = (event.get("responseStatus") or {}).get("code", 0)
    return (event["verb"] == "create" and not (event.get("objectRef") or {}).get("subresource")
            and 200 <= code < 300)


def audit_counts(events: list[dict[str, Any]], rollouts: int) -> dict[str, Any]:
    creates = collections.Counter(
        (e.get("objectRef") or {}).get("resource", "") for e in events if created(e))
    workload = [e for e in events if e["user"]["username"] == WORKLOAD_USER]
    per_second = collections.Counter(e["requestReceivedTimestamp"][:19] for e in events)
    by_user = collections.Counter(e["user"]["username"] for e in events
                                  if e["verb"] in WRITES)
    return {
        "sandbox_creations": creates["sandboxes"], "pod_creations": creates["pods"],
        "claim_creations": creates["sandboxclaims"],
        "creations_per_rollout": round((creates["sandboxes"] + sum(
            1 for e in workload if created(e)
            and (e.get("objectRef") or {}).get("resource") == "pods")) / rollouts, 4),
        "workload_writes_per_rollout": round(sum(
            1 for e in workload if e["verb"] in WRITES) / rollouts, 4),
        "all_writes_per_rollout": round(sum(
            1 for e in events if e["verb"] in WRITES) / rollouts, 4),
        "requests": len(events), "workload_requests": len(workload),
        "peak_requests_per_s": max(per_second.values(), default=0),
        "writes_by_user": dict(by_user.most_common()),
    }


def pull_counts(plane: ControlPlane, time_scale: float) -> dict[str, Any]:
    """From the kubelet's (node agent's) events: which sandbox pods waited for a pull and
    how long, in modelled seconds (``Pulled ... in N s`` is modelled already)."""
    out = plane.kubectl("-n", plane.namespace, "get", "events", "--field-selector",
                        "source=kubelet", "-o", "json").stdout
    waits: dict[str, float] = {}
    pulling: set[str] = set()
    for event in json.loads(out)["items"]:
        pod = event["involvedObject"]["name"]
        if "-pp-" in pod:  # a prepull pod (hydration.py names them so)
            continue
        if event["reason"] == "Pulling":
            pulling.add(pod)
        elif event["reason"] == "Pulled":
            took = re.search(r" in ([0-9.]+)s\.", event["message"])
            waits[pod] = float(took[1]) if took else 0.0
    wait = summarize(list(waits.values()))
    return {"critical_path_pulls": len(pulling), "sandbox_pods_seen": len(waits),
            "pull_wait_s": {"mean": round(wait.mean, 2), "p50": round(wait.p50, 2),
                            "p99": round(wait.p99, 2), "max": round(wait.max, 2)},
            "time_scale": time_scale}


def drain(plane: ControlPlane, patience_s: float) -> tuple[list[str], float]:
    """What of the burst is still in the namespace once the cluster has had up to
    ``patience_s`` to finish deleting it, and how long that took. Deletion is
    asynchronous (the SDK arm deletes its warm pool with ``--wait=false`` and the garbage
    collector removes the pool's pods after), so an object counts as left behind only
    when it outlives the wait."""
    started = time.monotonic()
    while True:
        left = plane.kubectl("-n", plane.namespace, "get", "sandboxclaims,sandboxes,pods",
                             "-o", "name").stdout.decode().split()
        waited = time.monotonic() - started
        if not left or waited >= patience_s:
            return left, round(waited, 1)
        time.sleep(1)


def run_arm(arm: str, args: argparse.Namespace) -> dict[str, Any]:
    with cluster(args) as plane:
        user = plane.users["workload"]
        kubeconfig = str(plane.write_kubeconfig(plane.state / "workload.json", user.name,
                                                user.token))
        cpu = {c: plane.cpu_seconds(c) for c in ("kube-apiserver", "etcd")}
        since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
        started = time.monotonic()
        if arm == "sdk":
            outcome = run_sdk(plane, kubeconfig, args)
        else:
            outcome = asyncio.run(run_rollbox(arm, plane, kubeconfig, args))
        wall = time.monotonic() - started
        cpu = {c: round(plane.cpu_seconds(c) - cpu[c], 1) for c in cpu}
        time.sleep(2)  # the audit log's batch is flushed
        counts = audit_counts(read_audit(plane, since), outcome["requested"])
        if args.pulls:
            counts.update(pull_counts(plane, args.time_scale))
        prepulls = outcome.get("planning", {}).get("prepulls", 0)
        counts["creations_per_rollout"] = round(
            counts["creations_per_rollout"] - prepulls / outcome["requested"], 4)
        counts["prepull_pods_per_rollout"] = round(prepulls / outcome["requested"], 4)
        left, drained = drain(plane, args.drain_wait)
    ready = summarize(outcome.pop("ready_s"))
    return {"arm": arm, "rollouts": outcome["requested"], **outcome, **counts,
            "ready_mean_s": round(ready.mean, 3), "ready_p99_s": round(ready.p99, 3),
            "ready_max_s": round(ready.max, 3), "apiserver_cpu_s": cpu["kube-apiserver"],
            "etcd_cpu_s": cpu["etcd"], "wall_s": round(wall, 1),
            "drained_s": drained, "left_after_burst": len(left)}


def table(results: list[dict[str, Any]]) -> str:
    cols = [("arm", "arm"), ("rollouts", "rollouts"),
            ("creations_per_rollout", "creations/rollout"),
            ("workload_writes_per_rollout", "API writes/rollout (client)"),
            ("all_writes_per_rollout", "API writes/rollout (all)"),
            ("peak_requests_per_s", "peak API req/s"),
            ("ready_mean_s", "request→ready mean s"), ("ready_p99_s", "p99 s"),
            ("ready_max_s", "max s"), ("apiserver_cpu_s", "apiserver CPU s"),
            ("etcd_cpu_s", "etcd CPU s"), ("pod_creations", "pods created"),
            ("succeeded", "ok"), ("failed", "failed"), ("accounted", "accounted"),
            ("wall_s", "wall s")]
    lines = ["| " + " | ".join(h for _, h in cols) + " |", "|" + "---|" * len(cols)]
    for r in results:
        lines.append("| " + " | ".join(str(r[k]) for k, _ in cols) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--tasks", type=int, default=250)
    parser.add_argument("--rollouts", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--qps", type=float, default=20.0,
                        help="the client's pacing (with --adaptive-pacing: its cap)")
    parser.add_argument("--burst", type=int, default=40)
    parser.add_argument("--adaptive-pacing", action="store_true",
                        help="follow the API server's signals up to --qps (AdaptiveRate)")
    parser.add_argument("--agent-starting", type=int, default=16,
                        help="pods the node agent starts at once")
    parser.add_argument("--runtime-wait", type=float, default=120.0,
                        help="how long rollbox waits for a new pod's runtime (a busy node "
                             "agent on 2 cores can be slow to answer)")
    parser.add_argument("--drain-wait", type=float, default=300.0,
                        help="how long the cluster gets to delete an arm's objects before "
                             "those still there count as left behind")
    parser.add_argument("--pulls", action="store_true",
                        help="every task its own image, pulled by the nodes (see above)")
    parser.add_argument("--disk-gb", type=float, default=20.0,
                        help="with --pulls: each node's image disk")
    parser.add_argument("--time-scale", type=float, default=0.02,
                        help="with --pulls: real seconds per modelled second of a pull")
    parser.add_argument("--lead", type=float, default=0.0,
                        help="seconds the burst is expected before it starts (see above)")
    parser.add_argument("--arm", action="append", choices=ARMS,
                        help=f"default: all ({', '.join(PULL_ARMS)} with --pulls)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--keep", action="store_true", help="keep each cluster's state")
    args = parser.parse_args(argv)
    results = []
    for arm in args.arm or (PULL_ARMS if args.pulls else ARMS):
        result = run_arm(arm, args)
        results.append(result)
        print(json.dumps(result), flush=True)
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
