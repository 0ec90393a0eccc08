"""Reading deploy/kubernetes/ for the checks in this directory.

The manifests are plain YAML files, each with one or more documents; kustomization.yaml lists the ones
`kubectl apply -k` applies. These helpers load them, find objects by kind and name, evaluate label
selectors the way the API server does, and emulate the two things the kubelet does to a container's
command line that podman does not (`$(VAR)` expansion).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

import yaml

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "deploy" / "kubernetes"
KUSTOMIZATION = MANIFESTS / "kustomization.yaml"
VENV_BIN = ROOT / "target" / "k8s-venv" / "bin"

# A manifest file larger than this is not ours: refuse to parse it rather than spend memory on it.
MAX_MANIFEST_BYTES = 1 << 20

Obj = dict[str, Any]


class ManifestError(Exception):
    """A manifest file that cannot be used, with the file it came from."""


def load_file(path: Path) -> list[Obj]:
    """Every non-empty YAML document of one file, each tagged with the file it came from."""
    size = path.stat().st_size
    if size > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{path}: {size} bytes, over the {MAX_MANIFEST_BYTES}-byte cap")
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except yaml.YAMLError as e:
        raise ManifestError(f"{path}: {e}") from e
    for d in docs:
        if not isinstance(d, dict):
            raise ManifestError(f"{path}: a document is not a mapping")
        d["__file__"] = path.name
    return docs


def load_text(text: str) -> list[Obj]:
    """Every non-empty YAML document of a multi-document string (e.g. `kubectl kustomize` output)."""
    return [d for d in yaml.safe_load_all(text) if d is not None]


def manifest_files() -> list[Path]:
    """Every Kubernetes manifest in deploy/kubernetes/ (kustomization.yaml is kustomize's, not the API's)."""
    files = sorted(p for p in MANIFESTS.glob("*.yaml") if p != KUSTOMIZATION)
    if not files:
        raise ManifestError(f"no manifests in {MANIFESTS}")
    return files


def all_objects() -> list[Obj]:
    """Every object of every manifest file."""
    return [o for f in manifest_files() for o in load_file(f)]


def kustomization() -> Obj:
    """kustomization.yaml, parsed."""
    (k,) = load_file(KUSTOMIZATION)
    return k


def find(objs: list[Obj], kind: str, name: str | None = None) -> list[Obj]:
    """The objects of a kind (and name, if given)."""
    return [
        o
        for o in objs
        if o.get("kind") == kind and (name is None or o["metadata"]["name"] == name)
    ]


def one(objs: list[Obj], kind: str, name: str) -> Obj:
    """The one object of that kind and name; fails the caller's assertion if there is not exactly one."""
    found = find(objs, kind, name)
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def pod_spec(obj: Obj) -> Obj | None:
    """The pod template's spec of a workload (Deployment, Job, ...), or a Pod's spec; None otherwise."""
    if obj.get("kind") == "Pod":
        return obj["spec"]
    template = obj.get("spec", {}).get("template")
    if obj.get("kind") == "CronJob":
        template = obj["spec"]["jobTemplate"]["spec"]["template"]
    return template["spec"] if template else None


def pod_labels(obj: Obj) -> dict[str, str]:
    """The labels a workload's pods get."""
    if obj.get("kind") == "Pod":
        return obj["metadata"].get("labels", {})
    return obj["spec"]["template"]["metadata"].get("labels", {})


def containers(spec: Obj) -> Iterator[Obj]:
    """Every container of a pod spec, init and ephemeral ones included."""
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from spec.get(key) or []


def selector_matches(selector: Obj | None, labels: dict[str, str]) -> bool:
    """Whether a LabelSelector selects an object with these labels (an empty selector selects all;
    a missing one, as in a NetworkPolicy peer, selects nothing here: callers decide what None means)."""
    if selector is None:
        return False
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def namespace_labels(objs: list[Obj], name: str) -> dict[str, str]:
    """The labels a namespace has, including the one the API server adds to every namespace."""
    ns = one(objs, "Namespace", name)
    return {**ns["metadata"].get("labels", {}), "kubernetes.io/metadata.name": name}


def flag(args: list[str], name: str) -> str | None:
    """The value of `--name=VALUE` (or `--name VALUE`) in a container's args, or None."""
    for i, a in enumerate(args):
        if a.startswith(f"{name}="):
            return a.split("=", 1)[1]
        if a == name and i + 1 < len(args):
            return args[i + 1]
    return None


_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expand_env(args: list[str], env: list[Obj]) -> list[str]:
    """`$(VAR)` references in command/args replaced as the kubelet does: from the container's `env`
    entries with a literal value; unknown references stay as written. (`$$(VAR)` escapes are not used
    in these manifests and are not handled.)"""
    values = {e["name"]: e["value"] for e in env if "value" in e}
    return [_VAR.sub(lambda m: values.get(m.group(1), m.group(0)), a) for a in args]


def allowlist_port_entries(text: str) -> set[int]:
    """The ports of the `host:port` entries of an allowlist in the allowed-hosts format (80 and 443 are
    the same as the plain entry and need no port of their own)."""
    ports = set()
    for line in text.splitlines():
        entry = line.split("#", 1)[0].strip()
        if ":" in entry:
            port = int(entry.rsplit(":", 1)[1])
            if port not in (80, 443):
                ports.add(port)
    return ports
