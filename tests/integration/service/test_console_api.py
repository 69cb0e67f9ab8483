"""The console's page and its own small reads: served with a strict CSP, who a key is, the
live series (admin only, strict parameters), policy validation that activates nothing, and
no console at all with GATEWAY_CONSOLE=false."""

from __future__ import annotations

from pathlib import Path

from tests.integration.service.harness import ADMIN, sqlite_gateway


async def test_console_routes(tiny_manifest: Path, tmp_path: Path) -> None:
    async with sqlite_gateway(tiny_manifest, tmp_path) as gw:
        c = gw.client
        page = await c.get("/console")
        assert page.status_code == 200 and "<title>Gateway console</title>" in page.text
        assert "script-src 'self'" in page.headers["content-security-policy"]
        for asset in ("app.js", "charts.js", "views/audit.js", "vendor/uPlot.iife.min.js"):
            assert (await c.get(f"/console/static/{asset}")).status_code == 200, asset
        assert "/console" not in str((await c.get("/schema/openapi.json")).json()["paths"])

        assert (await c.get("/console/api/whoami", headers=ADMIN)).json()["role"] == "admin"
        auditor = {"authorization": f"Bearer {gw.auditor_key}"}
        who = (await c.get("/console/api/whoami", headers=auditor)).json()
        assert (who["role"], who["tenant"]) == ("auditor", gw.tenant)
        assert (await c.get("/console/api/whoami", headers=gw.auth)).status_code == 403
        r = await c.get("/console/api/whoami")
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"

        assert (await gw.complete(max_tokens=4, temperature=0)).status_code == 200
        live = (await c.get("/console/api/live", headers=ADMIN)).json()
        assert live["tenants"] == [gw.tenant] and live["drafts"] == ["standard"]
        rows = (await c.get(f"/console/api/live?tenant={gw.tenant}", headers=ADMIN)).json()
        assert sum(x["requests"] for x in rows["data"]) == 1
        assert (await c.get("/console/api/live", headers=auditor)).status_code == 403
        for query, param in (("?bogus=1", "bogus"), ("?window=0", "window"),
                             ("?window=x", "window"), ("?tenant=a&draft=b", "draft")):  # fmt: skip
            r = await c.get(f"/console/api/live{query}", headers=ADMIN)
            assert r.status_code == 400 and r.json()["error"]["param"] == param, query

        keys = (await c.get(f"/console/api/tenants/{gw.tenant}/keys", headers=ADMIN)).json()
        assert sorted(k["role"] for k in keys["data"]) == ["auditor", "tenant"]
        assert all("hash" not in name for k in keys["data"] for name in k)
        assert (
            await c.get(f"/console/api/tenants/{gw.tenant}/keys", headers=auditor)
        ).status_code == 403

        before = (await c.get("/admin/policies", headers=ADMIN)).json()["revision"]
        url = "/console/api/policy/validate"
        bad = await c.post(url, json={"tenant": gw.tenant, "document": {"nope": 1}}, headers=ADMIN)
        assert bad.status_code == 400 and "nope" in bad.json()["error"]["message"]
        good = await c.post(url, json={"tenant": gw.tenant, "document": {}}, headers=ADMIN)
        assert good.status_code == 200 and good.json()["valid"] is True
        assert good.json()["revision"] != before
        assert (await c.post(url, content=b"{", headers=ADMIN)).status_code == 400
        assert (await c.post(url, json={"tenant": 1}, headers=ADMIN)).status_code == 400
        assert (await c.get("/admin/policies", headers=ADMIN)).json()["revision"] == before


async def test_console_can_be_turned_off(tiny_manifest: Path, tmp_path: Path) -> None:
    async with sqlite_gateway(tiny_manifest, tmp_path, console=False) as gw:
        assert (await gw.client.get("/console")).status_code == 404
        assert (await gw.client.get("/console/api/whoami", headers=ADMIN)).status_code == 404
