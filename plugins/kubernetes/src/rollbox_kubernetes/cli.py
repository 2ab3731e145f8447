"""``rollbox k8s render | preflight | reap``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import urllib.parse
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from rollbox import cli_args, settings
from rollbox.errors import BackendUnavailableError
from rollbox.spec import Network, Resources, SandboxSpec

from rollbox_kubernetes import render
from rollbox_kubernetes.resources import (
    LABEL_RUN,
    TAINT_EFFECTS,
    label_problem,
    namespace_problem,
    run_id_problem,
)

if TYPE_CHECKING:
    from rollbox_kubernetes.backend import KubernetesBackend


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="k8s_command", metavar="ACTION", required=True)
    rend = sub.add_parser(
        "render", help="print the SandboxTemplates, SandboxWarmPools and RBAC rollbox needs "
        "for some images, as YAML for kubectl apply -f -")
    _cluster_options(rend, connect=False)
    rend.add_argument("--image", action="append", required=True, type=cli_args.nonempty,
                      help="image to render a template and warm pool for (repeatable)")
    rend.add_argument("--workdir", type=cli_args.absolute, default="/",
                      help="working directory in the sandbox")
    rend.add_argument("--network", choices=[n.value for n in Network], default="none",
                      help="none: a deny-all network policy; host: the cluster's own")
    rend.add_argument("--cpus", type=cli_args.positive, default=1.0,
                      help="CPU request and limit of each sandbox")
    rend.add_argument("--memory-mb", type=cli_args.positive_count, default=2048,
                      help="memory request and limit of each sandbox, in MiB")
    rend.add_argument("--replicas", type=cli_args.count, default=2,
                      help="warm pool size per image")
    rend.add_argument("--runtime-class", type=cli_args.nonempty,
                      help="RuntimeClass of the sandbox pods, e.g. gvisor (default: the "
                           "cluster's)")
    rend.add_argument("--node-selector", action="append", default=[], metavar="KEY=VALUE",
                      type=_node_selector, help="schedule only on nodes with this label "
                      "(repeatable)")
    rend.add_argument("--toleration", action="append", default=[], type=_toleration,
                      metavar="KEY[=VALUE][:EFFECT]",
                      help="tolerate this node taint (repeatable); no EFFECT: every effect")
    rend.add_argument("--no-rbac", action="store_true", help="leave out ServiceAccount/Role")
    rend.add_argument("--image-planning", action="store_true",
                      help="also the ClusterRole to read nodes that image_planning needs")
    pre = sub.add_parser("preflight", help="check that a cluster is ready for rollbox: the "
                         "namespace, the agent-sandbox CRDs and rollbox's permissions")
    _cluster_options(pre, connect=True)
    reap = sub.add_parser("reap", help="delete every object one run (--run-id) left behind "
                          "in a namespace, and nothing of any other run")
    _cluster_options(reap, connect=True)
    reap.add_argument("--dry-run", action="store_true", help="list, do not delete")


def _cluster_options(parser: argparse.ArgumentParser, *, connect: bool) -> None:
    parser.add_argument("--namespace", type=_namespace,
                        help="namespace (default: $ROLLBOX_K8S_NAMESPACE, else 'default')")
    parser.add_argument("--run-id", type=_run_id,
                        help="the run whose objects these are, the value of the label "
                             f"{LABEL_RUN} (default: $ROLLBOX_RUN_ID, else 'rollbox')")
    if connect:
        parser.add_argument("--kubeconfig", type=cli_args.nonempty,
                            help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)")
        parser.add_argument("--context", type=cli_args.nonempty,
                            help="kubeconfig context (default: its current one)")
        parser.add_argument("--host", type=_api_url,
                            help="API server URL to use without credentials (emulators)")


def run(args: argparse.Namespace) -> int:
    args.namespace = args.namespace or settings.checked("ROLLBOX_K8S_NAMESPACE", "default",
                                                        namespace_problem)
    args.run_id = args.run_id or settings.checked("ROLLBOX_RUN_ID", "rollbox", run_id_problem)
    if args.k8s_command == "render":
        return _render(args)
    return asyncio.run(_preflight(args) if args.k8s_command == "preflight" else _reap(args))


def _checked(problem_of: Callable[[str], str | None]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        problem = problem_of(text)
        if problem is not None:
            raise argparse.ArgumentTypeError(f"{text!r} {problem}")
        return text

    return parse


_namespace = _checked(namespace_problem)
_run_id = _checked(run_id_problem)


def _api_url(text: str) -> str:
    """An http(s) URL with a host (the API server of an emulator)."""
    try:
        parts = urllib.parse.urlsplit(text)
        parts.port  # noqa: B018 -- raises ValueError for a port that is not a number
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"must be an http:// or https:// URL, got {text!r}")
    return text


def _node_selector(text: str) -> tuple[str, str]:
    key, value = cli_args.key_value(text)
    problem = label_problem(key, value)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return key, value


def _toleration(text: str) -> dict[str, str]:
    head, colon, effect = text.rpartition(":")
    if not colon:
        head, effect = text, ""
    elif effect not in TAINT_EFFECTS:
        raise argparse.ArgumentTypeError(
            f"effect {effect!r} must be one of {', '.join(TAINT_EFFECTS)}")
    key, eq, value = head.partition("=")
    problem = label_problem(key, value)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    tol = {"key": key, "operator": "Equal" if eq else "Exists"}
    if eq:
        tol["value"] = value
    if effect:
        tol["effect"] = effect
    return tol


def _render(args: argparse.Namespace) -> int:
    options = render.KubeOptions(
        namespace=args.namespace, run_id=args.run_id, runtime_class=args.runtime_class,
        node_selector=dict(args.node_selector), tolerations=tuple(args.toleration),
        warm_replicas=args.replicas,
    )
    specs = [SandboxSpec(image=image, workdir=args.workdir, network=Network(args.network),
                         resources=Resources(cpus=args.cpus, memory_mb=args.memory_mb))
             for image in args.image]
    sys.stdout.write(render.dump(render.render_all(
        specs, options, include_rbac=not args.no_rbac, image_planning=args.image_planning)))
    return 0


@contextlib.asynccontextmanager
async def _api_errors_explained() -> AsyncIterator[None]:
    """An API server's refusal, or no answer at all, as one line that says so."""
    from rollbox_kubernetes.client import ApiError

    try:
        yield
    except ApiError as err:
        what = ("cannot reach the API server" if err.status == 0
                else f"the API server refused ({err.status} {err.reason})")
        raise BackendUnavailableError(
            f"{what}: {err.message}; check KUBECONFIG / --context / --host and your "
            "permissions (rollbox k8s preflight)") from None


def _backend(args: argparse.Namespace) -> KubernetesBackend:
    from rollbox_kubernetes.backend import KubernetesBackend  # heavy: only to connect

    return KubernetesBackend(namespace=args.namespace, run_id=args.run_id, host=args.host,
                             kubeconfig=args.kubeconfig, context=args.context)


async def _preflight(args: argparse.Namespace) -> int:
    from rollbox_kubernetes.ops import preflight

    backend = _backend(args)
    async with backend, _api_errors_explained():
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
    async with backend, _api_errors_explained():
        client = await backend.connect()
        reaped = await reap(client, args.namespace, args.run_id, dry_run=args.dry_run)
    verb = "would delete" if args.dry_run else "deleted"
    for item in reaped:
        print(f"{verb} {len(item.names)} {item.kind}(s)" +
              (f": {', '.join(item.names)}" if item.names else ""))
    return 0
