"""The operator console in headless Chromium against a real gateway process (tiny models,
SQLite, tracing on with the in-memory exporter): an admin signs in, creates a tenant and a
key, starts a canary and watches both arms' charts fill with live traffic, rolls it back,
finds the rollback among the admin events, exports and verifies the audit chain; an
auditor reaches the audit views of its own tenant only."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.console.browser import browser_page, require_chromium, screenshot
from tests.integration.service.harness import ADMIN, ADMIN_KEY, MODEL
from tests.integration.service.process import start_gateway

pytestmark = [pytest.mark.slow, pytest.mark.browser]
TENANT = "team-browser"
SPECULATIVE = {"mode": "speculative", "proposer": "draft", "k": 3}


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[bytes]


@pytest.fixture(scope="module")
def server(tiny_manifest: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    require_chromium()
    var = tmp_path_factory.mktemp("console")
    proc, url, _ = start_gateway(tiny_manifest, var, env_extra={"OTEL_TRACES_EXPORTER": "memory"})
    yield Server(url, proc)
    proc.terminate()
    proc.wait(timeout=60)


def sign_in(page: Any, url: str, key: str) -> None:
    page.goto(f"{url}/console")
    page.fill("#key", key)
    page.click("#signin button[type=submit]")
    page.wait_for_selector("#who:not([hidden])")


def accept_next_dialog(page: Any, seen: list[str]) -> None:
    def accept(dialog: Any) -> None:
        seen.append(dialog.message)
        dialog.accept()

    page.once("dialog", accept)


def series_counts(page: Any, chart: str) -> list[int]:
    raw = page.get_attribute(chart, "data-series") or ""
    return [int(x) for x in raw.split(",") if x]


def complete(url: str, key: str, i: int) -> httpx.Response:
    body = {
        "model": MODEL, "prompt": f"def f{i}(x):", "max_tokens": 24, "temperature": 0,
        "decoding": SPECULATIVE,
    }  # fmt: skip
    return httpx.post(
        f"{url}/v1/completions", json=body, headers={"authorization": f"Bearer {key}"}, timeout=60
    )


def test_admin_runs_a_canary_end_to_end(server: Server, tmp_path: Path) -> None:
    url = server.url
    dialogs: list[str] = []
    with browser_page(tmp_path / "profile") as page:
        sign_in(page, url, ADMIN_KEY)
        assert page.text_content("#who") == "admin"
        page.wait_for_selector("#live-charts")  # an admin lands on the live view

        # -- a tenant and its key (the secret shown once, and it works) -----------------
        page.click("nav a[data-view=tenants]")
        page.fill("#tenant-id", TENANT)
        page.fill("#tenant-name", "Team Browser")
        page.click("#tenant-form button[type=submit]")
        page.wait_for_selector("#keys")
        page.click("#issue-tenant-key")
        key = (page.wait_for_selector("#secret-value").text_content() or "").strip()
        assert key.startswith("sk-")
        first = complete(url, key, 0)
        assert first.status_code == 200
        served_first = first.headers["x-draft-model"]  # e.g. tiny-draft@2
        screenshot(page, "tenants", tmp_path)
        listed = httpx.get(f"{url}/console/api/tenants/{TENANT}/keys", headers=ADMIN).json()
        assert [k["role"] for k in listed["data"]] == ["tenant"]
        assert key not in json.dumps(listed)

        # -- before any rollout, the draft that served is named alike everywhere --------
        page.click("nav a[data-view=rollouts]")
        page.wait_for_selector("#ro-draft option", state="attached")
        options = page.eval_on_selector_all(
            "#ro-draft option", "(os) => os.map((o) => [o.value, o.textContent])"
        )
        named = {value.replace("|", "@"): text for value, text in options}
        assert "serving:" in named.get(served_first, ""), named  # the console's pick list
        assert [v for v, text in named.items() if "serving:" in text] == [served_first], named
        models = httpx.get(f"{url}/admin/models", headers=ADMIN).json()["data"]
        serving = [
            f"{m['name']}@{m['version']}"
            for m in models
            if m.get("role") == "draft" and m.get("serving")
        ]
        assert serving == [served_first], models  # /admin/models says the same
        records = httpx.get(f"{url}/audit/records", params={"tenant": TENANT}, headers=ADMIN)
        drafts = {f"{r['draft_model']}@{r['draft_version']}" for r in records.json()["data"]}
        assert drafts == {served_first}, drafts  # and so do the audit records

        # -- a canary of the draft's version 2 against version 1 ------------------------
        page.select_option("#ro-draft", "tiny-draft|2")
        page.fill("#ro-percent", "50")
        accept_next_dialog(page, dialogs)
        page.click("#ro-start")
        page.wait_for_selector("#rollout-list [data-state=canary]")
        assert "50% of tiny-target" in dialogs[-1]
        rollout = httpx.get(f"{url}/admin/rollouts", headers=ADMIN).json()["data"][0]
        assert (rollout["version"], rollout["baseline_version"]) == ("2", "1")

        served: set[str] = set()
        for i in range(1, 40):
            r = complete(url, key, i)
            assert r.status_code == 200, r.text
            served.add(r.headers["x-draft-model"])
            if len(served) == 2 and i >= 8:
                break
        assert served == {"tiny-draft@1", "tiny-draft@2"}, "both arms served traffic"
        # both arms' charts fill (the page refreshes every 5 s by itself)
        page.wait_for_function(
            """() => ['#ro-chart-acceptance', '#ro-chart-tps', '#ro-chart-p95'].every((id) => {
                 const el = document.querySelector(id);
                 return el && el.dataset.series.split(',').every((n) => Number(n) > 0);
               })""",
            timeout=20_000,
        )
        assert all(n > 0 for n in series_counts(page, "#ro-chart-acceptance"))
        assert page.query_selector("#ro-chart-tps canvas") is not None
        screenshot(page, "rollouts", tmp_path, full_page=True)

        # -- pause and resume it, then roll it back, each with a confirmation -----------
        for action, state in (("pause", "paused"), ("resume", "canary")):
            accept_next_dialog(page, dialogs)
            page.click(f"#rollout-list button[data-action={action}]")
            page.wait_for_selector(f"#rollout-list [data-state={state}]")
        assert dialogs[-2].startswith("Pause rollout") and dialogs[-1].startswith("Resume")
        page.once("dialog", lambda d: d.dismiss())  # "no": nothing happens
        page.click("#rollout-list button[data-action=rollback]")
        page.wait_for_timeout(500)
        assert page.query_selector("#rollout-list [data-state=canary]") is not None
        accept_next_dialog(page, dialogs)
        page.click("#rollout-list button[data-action=rollback]")
        page.wait_for_selector("#rollout-list [data-state=rolled_back]")
        assert dialogs[-1].startswith("Roll back rollout")
        state = httpx.get(f"{url}/admin/rollouts/{rollout['id']}", headers=ADMIN).json()["state"]
        assert state == "rolled_back"

        # -- the live view of the tenant ------------------------------------------------
        page.goto(f"{url}/console#/live?tenant={TENANT}")
        page.wait_for_selector("#chart-requests[data-series]")
        assert series_counts(page, "#chart-requests")[0] > 0
        # every chart's time axis spans the chosen window, however few buckets have data
        for window in ("900", "3600"):
            page.select_option("#live-window", window)
            page.wait_for_function(
                "(w) => { const r = document.querySelector('#chart-requests')?.dataset.xRange;"
                " if (!r) return false; const [a, b] = r.split(',').map(Number);"
                " return Math.abs(b - a - w) <= 5; }",
                arg=int(window),
            )
            for chart in page.query_selector_all("#live-charts .chart[data-x-range]"):
                lo, hi = map(int, (chart.get_attribute("data-x-range") or "").split(","))
                assert abs(hi - lo - int(window)) <= 5, (window, lo, hi)
        screenshot(page, "live", tmp_path)

        # -- the rollback among the admin events, the records, export, verify -----------
        page.click("nav a[data-view=audit]")
        page.click("#tab-events")
        event = page.wait_for_selector("#events code[data-action='rollout.rolled_back']")
        row = event.evaluate("(el) => el.closest('tr').textContent")
        assert f"rollout:{rollout['id']}" in row
        page.click("#tab-records")
        page.fill("#f-tenant", TENANT)
        page.click("#audit-search")
        page.wait_for_selector("#records tbody tr")
        shown = page.locator("#records tbody tr").count()
        page.locator("#records tbody tr").first.click()
        page.wait_for_selector("#record")
        trace_id = page.text_content("#record [data-field=trace_id]") or ""
        assert re.fullmatch(r"[0-9a-f]{32}", trace_id), trace_id
        reasons = page.text_content("#record-reasons") or ""
        assert "override_honoured" in reasons
        screenshot(page, "audit", tmp_path, full_page=True)
        by_trace = httpx.get(
            f"{url}/audit/records", params={"trace_id": trace_id}, headers=ADMIN
        ).json()["data"]
        assert len(by_trace) == 1 and by_trace[0]["tenant_id"] == TENANT

        with page.expect_download() as jsonl:
            page.click("#export-jsonl")
        lines = Path(jsonl.value.path()).read_text().splitlines()
        assert len(lines) == shown and {json.loads(x)["tenant_id"] for x in lines} == {TENANT}
        with page.expect_download() as csv_file:
            page.click("#export-csv")
        rows = list(csv.DictReader(io.StringIO(Path(csv_file.value.path()).read_text())))
        assert len(rows) == shown and {r["tenant_id"] for r in rows} == {TENANT}

        page.click("#tab-verify")
        page.wait_for_selector("#verify-result")
        assert page.text_content("#verify-result") == "Chain verified: intact"
        assert page.errors == [] and page.failed_loads == []


def test_policy_editor_validates_before_saving(server: Server, tmp_path: Path) -> None:
    url = server.url
    with browser_page(tmp_path / "profile") as page:
        sign_in(page, url, ADMIN_KEY)
        page.click("nav a[data-view=policy]")
        page.wait_for_selector("#pol-doc")
        revision = page.text_content("#policy-revision")
        assert page.is_disabled("#pol-save")
        page.fill("#pol-doc", '{"no_such_field": 1}')
        page.click("#pol-validate")
        page.wait_for_selector("#pol-result.error")
        assert page.is_disabled("#pol-save")
        page.fill("#pol-doc", "{}")
        page.click("#pol-validate")
        page.wait_for_selector("#pol-result.ok")
        assert not page.is_disabled("#pol-save")
        page.fill("#pol-doc", "{ }")  # an edit after validating needs a new validation
        assert page.is_disabled("#pol-save")
        page.click("#res-run")
        page.wait_for_selector("#res-out dl")
        assert "policy_revision" in (page.text_content("#res-out") or "")
        screenshot(page, "policy", tmp_path)
        assert page.text_content("#policy-revision") == revision, "nothing was saved"
        assert page.errors == [] and len(page.failed_loads) == 1  # the refused validation


def test_auditor_reaches_only_its_audit_views(server: Server, tmp_path: Path) -> None:
    url = server.url
    auditor = httpx.post(
        f"{url}/admin/tenants/real/keys", json={"role": "auditor"}, headers=ADMIN
    ).json()["key"]
    tenant_key = httpx.post(
        f"{url}/admin/tenants/real/keys", json={"role": "tenant"}, headers=ADMIN
    ).json()["key"]
    for i in range(2):
        assert complete(url, tenant_key, 100 + i).status_code == 200
    with browser_page(tmp_path / "profile") as page:
        page.goto(f"{url}/console")
        page.fill("#key", tenant_key)
        page.click("#signin button[type=submit]")
        page.wait_for_selector("#signin-error:has-text('tenant inference key')")

        sign_in(page, url, auditor)
        assert page.text_content("#who") == "auditor · real"
        page.wait_for_selector("#audit-filters")  # an auditor lands on the audit view
        assert page.query_selector("#f-tenant") is None, "no tenant filter: its own tenant only"
        assert page.query_selector("#tab-events") is None, "admin events are the admin's"
        page.wait_for_selector("#records tbody tr")
        tenants = page.eval_on_selector_all(
            "#records tbody tr td:nth-child(3)", "(cells) => cells.map((c) => c.textContent)"
        )
        assert tenants and set(tenants) == {"real"}, tenants
        assert "null" not in page.inner_text("#view") and "undefined" not in page.inner_text(
            "#view"
        )
        screenshot(page, "auditor", tmp_path)
        for view in ("tenants", "rollouts", "policy", "live"):
            assert page.is_hidden(f"nav a[data-view={view}]"), view
            page.goto(f"{url}/console#/{view}")
            page.wait_for_selector("#forbidden")
        # and the API refuses whatever the page would show
        statuses = page.evaluate(
            """async () => {
                 const key = sessionStorage.getItem('gw.key');
                 const get = (p) => fetch(p, {headers: {authorization: 'Bearer ' + key}})
                   .then((r) => r.status);
                 return [await get('/admin/tenants'), await get('/console/api/live'),
                         await get('/console/api/tenants/real/keys'),
                         await get('/audit/records?tenant=team-browser'),
                         await get('/audit/records')];
               }"""
        )
        assert statuses == [403, 403, 403, 403, 200]
        assert page.errors == []


def test_promotion_shows_the_regression_gate(tiny_manifest: Path, tmp_path: Path) -> None:
    """Promote runs the regression gate first and the page shows its verdict."""
    require_chromium()
    (tmp_path / "var").mkdir()
    proc, url, _ = start_gateway(tiny_manifest, tmp_path / "var")
    dialogs: list[str] = []
    try:
        with browser_page(tmp_path / "profile") as page:
            sign_in(page, url, ADMIN_KEY)
            page.click("nav a[data-view=rollouts]")
            page.select_option("#ro-draft", "tiny-draft|2")
            accept_next_dialog(page, dialogs)
            page.click("#ro-start")
            page.wait_for_selector("#rollout-list [data-state=canary]")
            accept_next_dialog(page, dialogs)
            page.click("#rollout-list button[data-action=promote]")
            page.wait_for_selector("#gate-result", timeout=120_000)
            page.wait_for_selector("#rollout-list [data-state=promoted]")
            assert dialogs[-1].startswith("Promote (runs the regression gate first)")
            verdict = page.text_content("#gate-result") or ""
            assert "Passed" in verdict and "prompts checked" in verdict, verdict
            assert page.query_selector("#rollout-list button[data-action]") is None
            assert page.errors == [] and page.failed_loads == []
        models = httpx.get(f"{url}/admin/models", headers=ADMIN).json()["data"]
        status = {(m["name"], m["version"]): m["status"] for m in models}
        assert status[("tiny-draft", "2")] == "active"
    finally:
        proc.terminate()
        proc.wait(timeout=60)
