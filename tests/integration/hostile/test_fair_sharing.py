"""A hog tenant at full tilt cannot starve a victim tenant (issue 44), on a real server.

The hog streams n = 4 requests as fast as its limits allow, more clients than the batch has
rows; the victim sends short requests one after another. With the default fairness policy
the victim is always served, each request in well under the time a hog request takes (it
takes a row from the hog at once: preemption, counted in /metrics). The negative control
gives the hog the whole batch and queue and a weight that puts it first (its share is then
the whole batch): the same measurement then sees the victim starve, so the test catches a
gateway that lets one tenant crowd out the others."""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.service.harness import ADMIN, MODEL
from tests.integration.service.process import start_gateway

BATCH, QUEUE = 4, 8
HOG_CLIENTS = 6
VICTIM_REQUESTS = 6
VICTIM_TIMEOUT_S = 10.0


def _tenant(url: str, tenant: str, policy: dict[str, Any] | None = None) -> str:
    httpx.post(f"{url}/admin/tenants", json={"id": tenant, "name": tenant}, headers=ADMIN)
    if policy is not None:
        r = httpx.put(f"{url}/admin/policies/tenants/{tenant}", json=policy, headers=ADMIN)
        assert r.status_code == 200, r.text
    r = httpx.post(f"{url}/admin/tenants/{tenant}/keys", json={"role": "tenant"}, headers=ADMIN)
    return str(r.json()["key"])


def _scenario(url: str, hog: str, victim: str) -> dict[str, Any]:
    stop = threading.Event()
    hog_durations: list[float] = []
    hog_refused = [0]

    def hog_client(i: int) -> None:
        body = {
            "model": MODEL, "prompt": f"def hog{i}(", "max_tokens": 200, "n": 4,
            "temperature": 1.0, "stream": True,
        }  # fmt: skip
        with httpx.Client(timeout=120) as client:
            while not stop.is_set():
                t = time.perf_counter()
                with client.stream(
                    "POST", f"{url}/v1/completions", json=body,
                    headers={"authorization": f"Bearer {hog}"},
                ) as r:  # fmt: skip
                    done = False
                    for line in r.iter_lines():
                        done = done or line == "data: [DONE]"
                        if stop.is_set():
                            break
                if done and not stop.is_set():  # served whole (not evicted for the victim)
                    hog_durations.append(time.perf_counter() - t)
                elif r.status_code != 200:
                    hog_refused[0] += 1
                    time.sleep(0.05)

    threads = [threading.Thread(target=hog_client, args=(i,)) for i in range(HOG_CLIENTS)]
    for t in threads:
        t.start()
    time.sleep(2.0)  # the hog fills the batch and the queue
    victim_latency: list[float] = []
    victim_status: list[int] = []
    try:
        with httpx.Client(timeout=VICTIM_TIMEOUT_S) as client:
            for i in range(VICTIM_REQUESTS):
                body = {"model": MODEL, "prompt": f"def v{i}(", "max_tokens": 8}
                t = time.perf_counter()
                try:
                    r = client.post(
                        f"{url}/v1/completions", json=body,
                        headers={"authorization": f"Bearer {victim}"},
                    )  # fmt: skip
                    victim_status.append(r.status_code)
                except httpx.TimeoutException:
                    victim_status.append(0)
                victim_latency.append(time.perf_counter() - t)
                if victim_status[-1] != 200:
                    break  # starved: one is enough to tell
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    return {
        "victim_status": victim_status,
        "victim_worst_s": max(victim_latency),
        "hog_median_s": statistics.median(hog_durations) if hog_durations else None,
        "hog_refused": hog_refused[0],
    }


def _run(tiny_manifest: Path, tmp_path: Path, hog_policy: dict[str, Any] | None) -> dict:
    proc, url, _ = start_gateway(
        tiny_manifest, tmp_path, max_batch=str(BATCH), queue_capacity=str(QUEUE),
        max_active=str(BATCH), torch_threads="1",
        default_requests_per_minute="1000000", default_tokens_per_minute="1000000000",
    )  # fmt: skip
    try:
        hog = _tenant(url, "hog", hog_policy)
        victim = _tenant(url, "victim")
        seen = _scenario(url, hog, victim)
        r = httpx.get(f"{url}/audit/records", params={"tenant": "hog", "limit": 500},
                      headers=ADMIN)  # fmt: skip
        assert r.status_code == 200, r.text
        seen["hog_waited"] = sum("fairness.waited" in x["reason_codes"] for x in r.json()["data"])
        metrics = httpx.get(f"{url}/metrics", headers=ADMIN).text
        seen["preemptions"] = _sample(metrics, "gateway_preemptions_total")
        seen["parked_now"] = _sample(metrics, "gateway_parked_requests")
        return seen
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def _sample(metrics: str, name: str) -> float:
    return next(float(line.split()[1]) for line in metrics.splitlines() if line.startswith(name))


def _victim_is_served(seen: dict[str, Any]) -> bool:
    """Every victim request answered, none waiting as long as half a hog request."""
    hog = seen["hog_median_s"] or VICTIM_TIMEOUT_S
    return all(s == 200 for s in seen["victim_status"]) and seen["victim_worst_s"] < hog / 2


def test_a_hog_tenant_cannot_starve_another(tiny_manifest: Path, tmp_path: Path) -> None:
    seen = _run(tiny_manifest, tmp_path, None)
    assert seen["hog_median_s"] is not None, seen  # the hog was served too
    assert seen["hog_waited"] > 0, seen  # its records say it gave rows up or sat steps out
    assert seen["preemptions"] > 0 and seen["parked_now"] == 0, seen  # all resumed and ended
    assert _victim_is_served(seen), seen


def test_control_an_uncapped_first_in_line_hog_starves_the_victim(
    tiny_manifest: Path, tmp_path: Path
) -> None:
    """The negative control: the hog's policy grants it what the old FIFO did (the whole
    batch and queue) and puts it first; the same check must then fail."""
    policy = {"fairness": {"max_rows": BATCH, "max_queued": QUEUE, "weight": 1000}}
    seen = _run(tiny_manifest, tmp_path, policy)
    assert seen["preemptions"] == 0, seen  # its weight puts its share at the whole batch
    assert not _victim_is_served(seen), seen


pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")
