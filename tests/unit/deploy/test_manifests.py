"""deploy/ and docker-compose.yml, checked with no cluster and no Docker engine: every
Kubernetes object validates against the Kubernetes 1.37 OpenAPI schemas (kubernetes-validate,
strict: unknown fields fail), the GPU overlay does once patched over the base, the objects
refer to each other correctly, and every GATEWAY_* variable they set is a real setting."""

from __future__ import annotations

import copy
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gateway.settings import Settings

ROOT = Path(__file__).resolve().parents[3]
BASE = ROOT / "deploy" / "base"
GPU = ROOT / "deploy" / "overlays" / "gpu"
K8S_VERSION = "1.37.0"
SETTINGS = {f"GATEWAY_{f.name.upper()}" for f in fields(Settings)}


def load_all(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def kustomization(folder: Path) -> dict[str, Any]:
    return yaml.safe_load((folder / "kustomization.yaml").read_text())  # type: ignore[no-any-return]


def base_objects() -> list[dict[str, Any]]:
    return [doc for name in kustomization(BASE)["resources"] for doc in load_all(BASE / name)]


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def merge(base: Any, patch: Any) -> Any:
    """Kubernetes strategic merge, as far as these patches need it: maps merge, lists of
    named maps merge by name, anything else is replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            out[key] = merge(base[key], value) if key in base else value
        return out
    if (
        isinstance(base, list)
        and isinstance(patch, list)
        and all(isinstance(x, dict) and "name" in x for x in base + patch)
    ):
        named = {x["name"]: x for x in base}
        for x in patch:
            named[x["name"]] = merge(named[x["name"]], x) if x["name"] in named else x
        return list(named.values())
    return copy.deepcopy(patch)


def gpu_deployment() -> dict[str, Any]:
    (deployment,) = by_kind(base_objects(), "Deployment")
    (patch_ref,) = kustomization(GPU)["patches"]
    (patch,) = load_all(GPU / patch_ref["path"])
    assert (patch["kind"], patch["metadata"]["name"]) == ("Deployment", "gateway")
    return merge(deployment, patch)  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    "obj", base_objects(), ids=lambda o: f"{o['kind']}/{o['metadata']['name']}"
)
def test_each_base_object_validates_against_the_kubernetes_schema(obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_the_schema_check_can_fail() -> None:
    (deployment,) = by_kind(base_objects(), "Deployment")
    broken = copy.deepcopy(deployment)
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["pathh"] = "/"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)
    del broken["spec"]["selector"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=False)


def test_every_file_is_listed_and_the_overlay_points_at_the_base() -> None:
    files = {p.name for p in BASE.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization(BASE)["resources"]) == files
    assert kustomization(GPU)["resources"] == ["../../base"]


def test_the_gateway_deployment_is_wired_for_replicas() -> None:
    objects = base_objects()
    (deployment,) = by_kind(objects, "Deployment")
    pod = deployment["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert deployment["spec"]["replicas"] >= 2
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (c,) = pod["spec"]["containers"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert {"cpu", "memory"} <= set(c["resources"]["requests"])
    port = next(p for p in c["ports"] if p["name"] == "http")["containerPort"]
    # the refs resolve to objects in the base
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    for source in c["envFrom"]:
        kind, ref = (
            ("ConfigMap", source["configMapRef"])
            if "configMapRef" in source
            else ("Secret", source["secretRef"])
        )
        assert (kind, ref["name"]) in names
    for volume in pod["spec"]["volumes"]:
        if "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            assert ("PersistentVolumeClaim", claim) in names
    (service,) = [o for o in by_kind(objects, "Service") if o["metadata"]["name"] == "gateway"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"][0]["targetPort"] in ("http", port)
    (pdb,) = by_kind(objects, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"]
    # PostgreSQL and Redis are external; the secret's URLs name those services
    external = {o["metadata"]["name"] for o in by_kind(objects, "Service")} - {"gateway"}
    assert external == {"postgres", "redis"}
    (secret,) = by_kind(objects, "Secret")
    urls = secret["stringData"]
    assert "@postgres:5432/" in urls["GATEWAY_DATABASE_URL"]
    assert urls["GATEWAY_REDIS_URL"].startswith("redis://redis:6379")
    (job,) = by_kind(objects, "Job")
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command == ["python", "-m", "gateway.database", "upgrade"]


def test_every_gateway_variable_is_a_real_setting() -> None:
    objects = base_objects()
    set_here = set(by_kind(objects, "ConfigMap")[0]["data"]) | set(
        by_kind(objects, "Secret")[0]["stringData"]
    )
    set_here |= {
        e["name"] for e in gpu_deployment()["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for service in compose["services"].values():
        set_here |= set(service.get("environment", {}))
    gateway_vars = {v for v in set_here if v.startswith("GATEWAY_")}
    assert gateway_vars - SETTINGS == set()
    assert {"GATEWAY_DATABASE_URL", "GATEWAY_REDIS_URL", "GATEWAY_ADMIN_KEY"} <= gateway_vars


def test_the_gpu_variant_validates_and_asks_for_a_gpu() -> None:
    deployment = gpu_deployment()
    kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert {"name": "GATEWAY_DEVICE", "value": "cuda"} in c["env"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"  # kept from the base
    assert c["envFrom"]  # kept from the base


def test_compose_runs_two_replicas_behind_a_proxy_on_shared_postgres_and_redis() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"postgres", "redis", "migrate", "gateway-1", "gateway-2", "proxy"} <= set(services)
    replicas = [s for name, s in services.items() if name.startswith("gateway-")]
    envs = [s["environment"] for s in replicas]
    for key in ("GATEWAY_DATABASE_URL", "GATEWAY_REDIS_URL", "GATEWAY_ADMIN_KEY"):
        assert len({e[key] for e in envs}) == 1, f"replicas disagree on {key}"
    assert envs[0]["GATEWAY_REDIS_URL"].startswith("redis://redis:")
    assert "@postgres/" in envs[0]["GATEWAY_DATABASE_URL"]
    for s in replicas:
        assert s["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        assert s["environment"]["GATEWAY_MIGRATE_ON_START"] == "false"
    for name, s in services.items():  # every dependency exists
        assert set(s.get("depends_on", {})) <= set(services), name
    proxy = services["proxy"]
    assert proxy["ports"] == ["8000:8000"]
    host_conf, _ = proxy["volumes"][0].split(":", 1)
    conf = (ROOT / host_conf).read_text()
    upstream = set(re.findall(r"server\s+([\w-]+):8000", conf))
    assert upstream == {"gateway-1", "gateway-2"}
    assert "proxy_buffering off" in conf  # server-sent events stream through
    assert set(compose["volumes"]) == {"pgdata"}
