"""The operator metrics against a running gateway (tiny models): per tenant, mode, proposer
and draft version, consistent with the audit records; /metrics behind GATEWAY_METRICS_KEY;
and the Grafana dashboard and docker-compose provisioning read only what /metrics exposes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.service.harness import ADMIN, sqlite_gateway

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "deploy" / "grafana" / "gateway.json"
SPEC = {"mode": "speculative", "proposer": "draft", "k": 3}


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def value(found: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    return sum(
        v for lab, v in found.get(name, []) if all(lab.get(k) == x for k, x in labels.items())
    )


async def test_metrics_by_arm_match_the_audit_and_the_dashboard(
    tiny_manifest: Path, tmp_path: Path
) -> None:
    async with sqlite_gateway(tiny_manifest, tmp_path, metrics_key="scrape-me") as gw:
        for i in range(3):
            r = await gw.complete(f"def f{i}(x):", max_tokens=24, temperature=0, decoding=SPEC)
            assert r.status_code == 200 and r.headers["x-draft-model"] == "tiny-draft@1"
        r = await gw.complete(max_tokens=8, temperature=0, decoding={"mode": "standard"})
        assert r.status_code == 200

        assert (await gw.client.get("/metrics")).status_code == 401
        wrong = {"authorization": "Bearer nope"}
        assert (await gw.client.get("/metrics", headers=wrong)).status_code == 401
        assert (await gw.client.get("/metrics", headers=gw.auth)).status_code == 403
        assert (await gw.client.get("/metrics", headers=ADMIN)).status_code == 200
        scrape = await gw.client.get("/metrics", headers={"authorization": "Bearer scrape-me"})
        assert scrape.status_code == 200
        records = await gw.records()

    found = samples(scrape.text)
    arm = {"tenant": gw.tenant, "mode": "speculative", "proposer": "draft", "draft": "tiny-draft@1"}
    spec = [x for x in records if x["mode"] == "speculative"]
    drafted = sum(x["drafted_tokens"] for x in spec)
    accepted = sum(x["accepted_tokens"] for x in spec)
    assert drafted > 0
    assert value(found, "spec_decode_num_draft_tokens_total", **arm) == drafted
    assert value(found, "spec_decode_num_accepted_tokens_total", **arm) == accepted
    assert value(found, "gateway_spec_decode_rejected_tokens_total", **arm) == drafted - accepted
    assert value(found, "gateway_generation_tokens_total", **arm) == 3 * 24
    assert value(found, "gateway_target_forward_seconds_total", **arm) > 0
    assert value(found, "gateway_draft_forward_seconds_total", **arm) > 0
    assert value(found, "gateway_target_forwards_total", **arm) >= 3
    std = {"tenant": gw.tenant, "mode": "standard", "proposer": "none", "draft": "none"}
    assert value(found, "gateway_target_forwards_total", **std) == 8  # a step per token
    assert value(found, "gateway_queue_wait_seconds_count", **arm) == 3
    assert value(found, "gateway_time_per_output_token_seconds_count", **arm) == 3
    assert value(found, "gateway_time_to_first_token_seconds_count", **std) == 1

    # every series the dashboard reads is exposed, with the labels it groups by
    dash = json.loads(DASHBOARD.read_text())
    labels_of: dict[str, set[str]] = {}
    for name, rows in found.items():
        for lab, _ in rows:
            labels_of.setdefault(name, set()).update(lab)
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [v["definition"] for v in dash["templating"]["list"]]
    for expr in exprs:
        names = set(re.findall(r"\b((?:gateway|spec_decode)_[a-z_]+)", expr))
        assert names, expr
        for name in names:
            assert name in labels_of, f"{name} (in {expr}) is not in /metrics"
        for group in re.findall(r"by \(([^)]*)\)", expr):
            for label in (x.strip() for x in group.split(",")):
                if label != "le":
                    assert any(label in labels_of[n] for n in names), (label, expr)


def test_dashboard_and_compose_provisioning_fit_together() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 36
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) >= 10
    for p in dash["panels"]:
        pos = p["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24 and pos["h"] > 0, p["title"]
        assert p["targets"] and all(t["expr"].strip() for t in p["targets"]), p["title"]
    cells: set[tuple[int, int]] = set()
    for p in dash["panels"]:
        x, y, w, h = (p["gridPos"][k] for k in ("x", "y", "w", "h"))
        cells |= {(x + i, y + j) for i in range(w) for j in range(h)}
    area = sum(p["gridPos"]["w"] * p["gridPos"]["h"] for p in dash["panels"])
    assert len(cells) == area, "panels overlap"
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert variables == {"tenant", "mode", "proposer", "draft"}
    for expr in (t["expr"] for p in dash["panels"] for t in p["targets"]):
        assert set(re.findall(r"\$([a-z_]+)", expr)) - {"__rate_interval"} <= variables, expr

    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"gateway-1", "gateway-2", "prometheus", "grafana"} <= set(services)
    mounts = {}
    for name in ("prometheus", "grafana"):
        for volume in services[name]["volumes"]:
            source, target = volume.split(":")[:2]
            assert (ROOT / source).exists(), source
            mounts[target] = ROOT / source
    grafana_dash = mounts["/var/lib/grafana/dashboards/gateway.json"]
    assert grafana_dash.resolve() == DASHBOARD.resolve()
    provisioning = mounts["/etc/grafana/provisioning"]
    provider = yaml.safe_load((provisioning / "dashboards" / "gateway.yml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    source = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    ds = source["datasources"][0]
    assert ds["type"] == "prometheus" and ds["url"] == "http://prometheus:9090"
    uids = {p["datasource"]["uid"] for p in dash["panels"]}
    assert uids == {ds["uid"]}

    prom = yaml.safe_load(mounts["/etc/prometheus/prometheus.yml"].read_text())
    job = prom["scrape_configs"][0]
    assert job["metrics_path"] == "/metrics"
    replicas = sorted(name for name in services if name.startswith("gateway-"))
    assert job["static_configs"][0]["targets"] == [f"{name}:8000" for name in replicas]
    key_file = job["authorization"]["credentials_file"]
    assert {"source": "metrics_key", "target": key_file} in services["prometheus"]["configs"]
    assert "GATEWAY_METRICS_KEY" in compose["configs"]["metrics_key"]["content"]
    for replica in ("gateway-1", "gateway-2"):
        assert "GATEWAY_METRICS_KEY" in services[replica]["environment"]
