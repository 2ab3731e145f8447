"""``rollbox k8s render | preflight | reap``."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import TYPE_CHECKING

from rollbox.spec import Network, Resources, SandboxSpec

from rollbox_kubernetes import render

if TYPE_CHECKING:
    from rollbox_kubernetes.backend import KubernetesBackend


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="k8s_command", metavar="ACTION", required=True)
    rend = sub.add_parser("render", help="print templates, warm pools and RBAC as YAML")
    _cluster_options(rend, connect=False)
    rend.add_argument("--image", action="append", required=True,
                      help="image to render a template and warm pool for (repeatable)")
    rend.add_argument("--workdir", default="/", help="working directory in the sandbox")
    rend.add_argument("--network", choices=[n.value for n in Network], default="none")
    rend.add_argument("--cpus", type=float, default=1.0)
    rend.add_argument("--memory-mb", type=int, default=2048)
    rend.add_argument("--replicas", type=int, default=2, help="warm pool size per image")
    rend.add_argument("--runtime-class", help="e.g. gvisor")
    rend.add_argument("--node-selector", action="append", default=[], metavar="KEY=VALUE")
    rend.add_argument("--toleration", action="append", default=[],
                      metavar="KEY[=VALUE]:EFFECT")
    rend.add_argument("--no-rbac", action="store_true", help="leave out ServiceAccount/Role")
    pre = sub.add_parser("preflight", help="check namespace, CRDs and permissions")
    _cluster_options(pre, connect=True)
    reap = sub.add_parser("reap", help="delete every object one run left behind")
    _cluster_options(reap, connect=True)
    reap.add_argument("--dry-run", action="store_true", help="list, do not delete")


def _cluster_options(parser: argparse.ArgumentParser, *, connect: bool) -> None:
    parser.add_argument("--namespace", default=os.environ.get("ROLLBOX_K8S_NAMESPACE",
                                                              "default"))
    parser.add_argument("--run-id", default=os.environ.get("ROLLBOX_RUN_ID", "rollbox"),
                        help="ownership label value rollbox.dev/run")
    if connect:
        parser.add_argument("--kubeconfig", help="default: $KUBECONFIG or ~/.kube/config")
        parser.add_argument("--context", help="kubeconfig context")
        parser.add_argument("--host", help="API server URL without auth (emulators)")


def run(args: argparse.Namespace) -> int:
    if args.k8s_command == "render":
        return _render(args)
    return asyncio.run(_preflight(args) if args.k8s_command == "preflight" else _reap(args))


def _toleration(text: str) -> dict[str, str]:
    head, _, effect = text.rpartition(":")
    key, eq, value = (head or text).partition("=")
    tol = {"key": key, "operator": "Equal" if eq else "Exists"}
    if eq:
        tol["value"] = value
    if head:
        tol["effect"] = effect
    return tol


def _render(args: argparse.Namespace) -> int:
    options = render.KubeOptions(
        namespace=args.namespace, run_id=args.run_id, runtime_class=args.runtime_class,
        node_selector=dict(kv.split("=", 1) for kv in args.node_selector),
        tolerations=tuple(_toleration(t) for t in args.toleration),
        warm_replicas=args.replicas,
    )
    specs = [SandboxSpec(image=image, workdir=args.workdir, network=Network(args.network),
                         resources=Resources(cpus=args.cpus, memory_mb=args.memory_mb))
             for image in args.image]
    sys.stdout.write(render.dump(render.render_all(specs, options,
                                                   include_rbac=not args.no_rbac)))
    return 0


def _backend(args: argparse.Namespace) -> KubernetesBackend:
    from rollbox_kubernetes.backend import KubernetesBackend  # heavy: only to connect

    return KubernetesBackend(namespace=args.namespace, run_id=args.run_id, host=args.host,
                             kubeconfig=args.kubeconfig, context=args.context)


async def _preflight(args: argparse.Namespace) -> int:
    from rollbox_kubernetes.ops import preflight

    backend = _backend(args)
    async with backend:
        client = await backend.connect()
        checks = await preflight(client, args.namespace)
    failed = False
    for check in checks:
        mark = "ok  " if check.ok else ("FAIL" if check.required else "warn")
        print(f"[{mark}] {check.check}: {check.detail}")
        if not check.ok and check.fix:
            print(f"       fix: {check.fix}")
        failed |= check.required and not check.ok
    print("ready for rollbox" if not failed else "not ready: fix the FAIL lines above")
    return 1 if failed else 0


async def _reap(args: argparse.Namespace) -> int:
    from rollbox_kubernetes.ops import reap

    backend = _backend(args)
    async with backend:
        client = await backend.connect()
        reaped = await reap(client, args.namespace, args.run_id, dry_run=args.dry_run)
    verb = "would delete" if args.dry_run else "deleted"
    for item in reaped:
        print(f"{verb} {len(item.names)} {item.kind}(s)" +
              (f": {', '.join(item.names)}" if item.names else ""))
    return 0
