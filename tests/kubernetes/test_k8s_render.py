from __future__ import annotations

import yaml
from rollbox.spec import Network, Resources, SandboxSpec
from rollbox_kubernetes import render
from rollbox_kubernetes.resources import LABEL_RUN

OPTS = render.KubeOptions(namespace="rl", run_id="run1", runtime_class="gvisor",
                          node_selector={"pool": "sbx"},
                          tolerations=({"key": "sbx", "operator": "Exists"},),
                          warm_replicas=7)


def test_template_carries_image_resources_and_placement() -> None:
    spec = SandboxSpec(image="python:3.12", workdir="/src", env={"A": "1"},
                       resources=Resources(cpus=1.5, memory_mb=512, disk_mb=1000))
    tpl = render.template(spec, OPTS)
    pod = tpl["spec"]["podTemplate"]["spec"]
    (container,) = pod["containers"]
    assert tpl["apiVersion"] == "extensions.agents.x-k8s.io/v1beta1"
    assert container["image"] == "python:3.12"
    assert container["workingDir"] == "/src"
    assert {"name": "A", "value": "1"} in container["env"]
    assert container["resources"]["limits"] == {"cpu": "1500m", "memory": "512Mi",
                                                "ephemeral-storage": "1000Mi"}
    assert container["resources"]["requests"] == container["resources"]["limits"]
    assert pod["runtimeClassName"] == "gvisor"
    assert pod["nodeSelector"] == {"pool": "sbx"}
    assert pod["tolerations"] == [{"key": "sbx", "operator": "Exists"}]
    assert tpl["metadata"]["labels"][LABEL_RUN] == "run1"
    assert tpl["metadata"]["namespace"] == "rl"


def test_network_none_denies_all_and_host_uses_upstream_default() -> None:
    none = render.template(SandboxSpec(image="x"), OPTS)
    host = render.template(SandboxSpec(image="x", network=Network.HOST), OPTS)
    assert none["spec"]["networkPolicy"] == {"ingress": [], "egress": []}
    assert "networkPolicy" not in host["spec"]


def test_pool_and_claim_reference_each_other_by_name() -> None:
    spec = SandboxSpec(image="x")
    tpl, pool = render.template(spec, OPTS), render.warm_pool(spec, OPTS)
    assert pool["spec"]["sandboxTemplateRef"]["name"] == tpl["metadata"]["name"]
    assert pool["spec"]["replicas"] == 7
    key = render.spec_key(spec, OPTS)
    claim = render.claim("c1", pool["metadata"]["name"], key, OPTS)
    assert claim["spec"]["warmPoolRef"]["name"] == pool["metadata"]["name"]
    assert "env" not in claim["spec"]  # env on a claim forces a cold start upstream


def test_names_follow_spec_and_run() -> None:
    a, b = SandboxSpec(image="a"), SandboxSpec(image="b")
    assert render.template_name(render.spec_key(a, OPTS), OPTS) == render.template_name(
        render.spec_key(SandboxSpec(image="a"), OPTS), OPTS)
    assert render.spec_key(a, OPTS) != render.spec_key(b, OPTS)
    other_run = render.KubeOptions(run_id="run2")
    assert render.template(a, OPTS)["metadata"]["name"] != render.template(
        a, other_run)["metadata"]["name"]


def test_render_all_dumps_yaml_kubectl_can_apply() -> None:
    specs = [SandboxSpec(image="a"), SandboxSpec(image="a"), SandboxSpec(image="b")]
    docs = list(yaml.safe_load_all(render.dump(render.render_all(specs, OPTS))))
    kinds = [d["kind"] for d in docs]
    assert kinds == ["ServiceAccount", "Role", "RoleBinding", "SandboxTemplate",
                     "SandboxWarmPool", "SandboxTemplate", "SandboxWarmPool"]
    role = docs[1]
    assert {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create", "get"]} in (
        role["rules"])


def test_image_planning_adds_the_cluster_role_to_read_nodes() -> None:
    docs = render.render_all([SandboxSpec(image="a")], OPTS, image_planning=True)
    by_kind = {d["kind"]: d for d in docs}
    assert by_kind["ClusterRole"]["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}]
    binding = by_kind["ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == by_kind["ClusterRole"]["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": OPTS.service_account,
                                    "namespace": OPTS.namespace}]


def test_a_direct_sandbox_runs_the_templates_pod() -> None:
    spec = SandboxSpec(image="python:3.12", workdir="/src")
    tpl = render.template(spec, OPTS)
    box = render.sandbox("s1", spec, OPTS)
    assert box["apiVersion"] == "agents.x-k8s.io/v1beta1" and box["kind"] == "Sandbox"
    assert box["spec"]["podTemplate"]["spec"] == tpl["spec"]["podTemplate"]["spec"]
    labels = box["spec"]["podTemplate"]["metadata"]["labels"]
    assert labels == {**tpl["spec"]["podTemplate"]["metadata"]["labels"],
                      "rollbox.dev/network": "none"}
    # the run's deny-all policy selects exactly such pods and allows nothing
    policy = render.deny_all(OPTS)["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= labels.items()
    assert policy["policyTypes"] == ["Ingress", "Egress"] and not policy["egress"]
    host = render.sandbox("s2", spec.replace(network=Network.HOST), OPTS)
    assert "rollbox.dev/network" not in host["spec"]["podTemplate"]["metadata"]["labels"]
