"""The console's signed-checkpoints tab in headless Chromium, as an operator first meets it:
a gateway signs checkpoints of its audit log and has each cosigned by a witness that a
second gateway process runs. After a few requests the tab shows the latest checkpoint
(leaves, root, witness status), and checks a record's inclusion proof in the browser
(WebCrypto SHA-256 up the audit path to the signed root). The negative controls: the same
check against a proof altered in flight (one hash, one bit) and a leaf index moved by one
must say the proof does NOT lead to the signed root; a record id that does not exist is an
error, not a pass."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.database import Signer
from gateway.database.audit.note import COSIGNATURE_V1
from tests.integration.console.browser import browser_page, require_chromium, screenshot
from tests.integration.console.test_console_browser import sign_in
from tests.integration.service.harness import ADMIN, ADMIN_KEY, MODEL
from tests.integration.service.process import start_gateway

pytestmark = [pytest.mark.slow, pytest.mark.browser]
LOG_KEY = Signer.generate("gw.test/console-audit")
WITNESS_KEY = Signer.generate("witness.test/console", COSIGNATURE_V1)


@pytest.fixture(scope="module")
def gateway_url(tiny_manifest: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    require_chromium()
    witness, witness_url, _ = start_gateway(
        tiny_manifest, tmp_path_factory.mktemp("witness"), witness_key=WITNESS_KEY.skey,
        witness_logs=LOG_KEY.verifier.vkey,
    )  # fmt: skip
    var = tmp_path_factory.mktemp("signer")
    proc, url, key = start_gateway(
        tiny_manifest, var, audit_signing_key=LOG_KEY.skey,
        audit_checkpoint_file=str(var / "checkpoints.txt"),
        audit_witness_url=f"{witness_url}/witness/add-checkpoint",
        audit_witness_vkey=WITNESS_KEY.verifier.vkey, audit_checkpoint_interval_s="1",
    )  # fmt: skip
    try:
        for i in range(3):
            body = {"model": MODEL, "prompt": f"def f{i}(x):", "max_tokens": 4}
            r = httpx.post(
                f"{url}/v1/completions", json=body,
                headers={"authorization": f"Bearer {key}"}, timeout=60,
            )  # fmt: skip
            assert r.status_code == 200, r.text
        yield url
    finally:
        for p in (proc, witness):
            p.terminate()
            p.wait(timeout=60)


def _latest_witnessed(url: str, records: int) -> dict[str, Any]:
    """The newest checkpoint once it covers the requests' records and is cosigned."""
    deadline = time.monotonic() + 30
    while True:
        page = httpx.get(f"{url}/audit/checkpoints", params={"limit": 1}, headers=ADMIN).json()
        latest = page["data"][0] if page["data"] else None
        if latest and latest["tree_size"] >= records and latest["witnesses"]:
            return dict(latest)
        assert time.monotonic() < deadline, page
        time.sleep(0.5)


def _check(page: Any, record_id: str) -> tuple[str, str]:
    page.fill("#proof-record", record_id)
    page.evaluate("document.getElementById('proof-result').className = ''")
    page.click("#proof-check")
    page.wait_for_selector("#proof-result.ok, #proof-result.error")
    kind = page.get_attribute("#proof-result", "class") or ""
    return kind, page.text_content("#proof-result") or ""


def _flip_bit(b64: str) -> str:
    raw = bytearray(base64.b64decode(b64))
    raw[0] ^= 1
    return base64.b64encode(bytes(raw)).decode()


def test_checkpoint_tab_shows_the_witnessed_checkpoint_and_checks_a_proof(
    gateway_url: str, tmp_path: Path
) -> None:
    url = gateway_url
    records = httpx.get(f"{url}/audit/records", params={"limit": 10}, headers=ADMIN).json()["data"]
    assert len(records) >= 3
    latest = _latest_witnessed(url, len(records))
    record_id = str(records[-1]["id"])
    with browser_page(tmp_path / "profile") as page:
        sign_in(page, url, ADMIN_KEY)
        page.goto(f"{url}/console#/audit?tab=checkpoints")
        page.wait_for_selector("#checkpoint-latest #checkpoint-root")
        assert (page.text_content("#checkpoint-witness") or "").startswith("cosigned by")
        shown_root = page.text_content("#checkpoint-root")
        newest = httpx.get(f"{url}/audit/checkpoints", params={"limit": 1}, headers=ADMIN)
        assert shown_root in {latest["root_hash"], newest.json()["data"][0]["root_hash"]}
        sinks = page.text_content("#checkpoint-sinks") or ""
        assert "file:" in sinks and "witness:" in sinks and "cosigned" in sinks, sinks

        kind, text = _check(page, record_id)
        assert kind == "ok" and "lead to the signed root" in text, text
        screenshot(page, "audit-checkpoints", tmp_path, full_page=True)

        # -- negative controls: an altered proof, a moved index, a record not in the log ----
        def tamper(route: Any, change: str) -> None:
            response = route.fetch()
            proof = response.json()
            if change == "hash":
                proof["hashes"][0] = _flip_bit(proof["hashes"][0])
            else:
                proof["leaf_index"] = (proof["leaf_index"] + 1) % proof["tree_size"]
            route.fulfill(response=response, body=json.dumps(proof))

        for change in ("hash", "index"):
            page.route("**/proof", lambda route, c=change: tamper(route, c))
            kind, text = _check(page, record_id)
            page.unroute("**/proof")
            assert kind == "error" and "does NOT lead to the signed root" in text, (change, text)
        kind, text = _check(page, "99999999")
        assert kind == "error" and "signed root" not in text, text
        assert page.errors == []
