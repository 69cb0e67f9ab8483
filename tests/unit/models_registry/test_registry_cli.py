"""The admin CLI against a stub of the gateway's admin API (http.server in a thread)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from models_registry.cli import main

KEY = "admin-secret"
ROLLOUT = {"id": "ro-1", "state": "canary", "canary_percent": 10.0, "version": "2"}


@dataclass
class Stub:
    url: str
    calls: list[dict[str, Any]] = field(default_factory=list)


def respond(method: str, path: str, body: Any) -> tuple[int, Any]:
    if method == "GET" and path == "/admin/models":
        return 200, {"data": [{"name": "demo-code-draft", "version": "2", "role": "draft"}]}
    if method == "POST" and path == "/admin/models":
        return 201, {**body, "sha256": "ab" * 32}
    if method == "POST" and path == "/admin/rollouts":
        return 201, {**ROLLOUT, **body}
    if method == "GET" and path == "/admin/rollouts":
        return 200, {"data": [ROLLOUT]}
    if path == "/admin/rollouts/ro-1":
        return 200, ROLLOUT
    if path == "/admin/rollouts/ro-1/promote":
        return 409, {
            "error": {
                "message": "rollout ro-1: promotion blocked by the regression "
                "gate: prompt 'fib' differs at token 3",
                "type": "conflict_error",
                "param": None,
                "code": None,
            }
        }
    if path.startswith("/admin/rollouts/ro-1/"):
        return 200, {**ROLLOUT, "state": path.rsplit("/", 1)[1]}
    return 404, {"error": {"message": f"no route {path}", "type": "not_found_error"}}


@pytest.fixture
def stub() -> Iterator[Stub]:
    calls: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            calls.append(
                {
                    "method": self.command,
                    "path": self.path,
                    "body": body,
                    "auth": self.headers.get("Authorization"),
                }
            )
            if self.headers.get("Authorization") != f"Bearer {KEY}":
                status, payload = (
                    401,
                    {"error": {"message": "invalid admin key", "type": "authentication_error"}},
                )
            else:
                status, payload = respond(self.command, self.path, body)
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _serve

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield Stub(f"http://127.0.0.1:{server.server_address[1]}", calls)
    server.shutdown()
    server.server_close()


def run(stub: Stub, *argv: str, key: str = KEY) -> tuple[int, Any, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["--url", stub.url, "--admin-key", key, *argv], stdout=out, stderr=err)
    return code, json.loads(out.getvalue()) if out.getvalue() else None, err.getvalue()


def test_models_list_and_register(stub: Stub, tmp_path: Path) -> None:
    code, out, _ = run(stub, "models", "list")
    assert code == 0 and out["data"][0]["name"] == "demo-code-draft"
    assert stub.calls[-1] == {
        "method": "GET",
        "path": "/admin/models",
        "body": None,
        "auth": f"Bearer {KEY}",
    }
    code, out, _ = run(
        stub,
        "models",
        "register",
        "--dir",
        str(tmp_path / "d"),
        "--name",
        "demo-code-draft",
        "--version",
        "3",
        "--role",
        "draft",
        "--target",
        "demo-code-target",
    )
    assert code == 0 and out["sha256"] == "ab" * 32
    assert stub.calls[-1]["body"] == {
        "name": "demo-code-draft",
        "version": "3",
        "role": "draft",
        "target": "demo-code-target",
        "path": str((tmp_path / "d").resolve()),
    }


def test_rollout_start_sends_validated_guard(stub: Stub, tmp_path: Path) -> None:
    guard_file = tmp_path / "guard.json"
    guard_file.write_text('{"min_samples": 50, "window": 500}')
    code, out, _ = run(
        stub,
        "rollouts",
        "start",
        "--target",
        "demo-code-target",
        "--draft",
        "demo-code-draft",
        "--version",
        "2",
        "--canary-percent",
        "12.5",
        "--sticky",
        "--guard-json",
        f"@{guard_file}",
    )
    assert code == 0 and out["id"] == "ro-1"
    call = stub.calls[-1]
    assert (call["method"], call["path"]) == ("POST", "/admin/rollouts")
    assert call["body"] == {
        "target": "demo-code-target",
        "draft": "demo-code-draft",
        "version": "2",
        "canary_percent": 12.5,
        "sticky": True,
        "guard": {
            "min_samples": 50,
            "max_acceptance_drop": 0.1,
            "max_latency_regression": 0.25,
            "window": 500,
        },
    }


def test_rollout_actions_hit_their_paths(stub: Stub) -> None:
    assert run(stub, "rollouts", "list")[1]["data"] == [ROLLOUT]
    assert run(stub, "rollouts", "show", "ro-1")[1] == ROLLOUT
    for verb in ("pause", "resume", "rollback"):
        code, out, _ = run(stub, "rollouts", verb, "ro-1")
        assert code == 0 and out["state"] == verb
        assert stub.calls[-1]["path"] == f"/admin/rollouts/ro-1/{verb}"
        assert stub.calls[-1]["method"] == "POST"


def test_error_response_goes_to_stderr_with_exit_1(stub: Stub) -> None:
    code, out, err = run(stub, "rollouts", "promote", "ro-1")
    assert (code, out) == (1, None)
    assert err.strip() == (
        "error: rollout ro-1: promotion blocked by the regression gate: "
        "prompt 'fib' differs at token 3"
    )
    code, _, err = run(stub, "models", "list", key="wrong")
    assert code == 1 and "invalid admin key" in err


def test_local_validation_fails_before_any_request(stub: Stub) -> None:
    code, _, err = run(
        stub,
        "rollouts",
        "start",
        "--target",
        "t",
        "--draft",
        "d",
        "--version",
        "2",
        "--canary-percent",
        "10",
        "--guard-json",
        '{"max_acceptance_drop": 3}',
    )
    assert code == 1 and "max_acceptance_drop" in err
    code, _, err = run(
        stub,
        "rollouts",
        "start",
        "--target",
        "t",
        "--draft",
        "d",
        "--version",
        "2",
        "--canary-percent",
        "120",
    )
    assert code == 1 and "--canary-percent" in err
    code, _, err = run(
        stub, "models", "register", "--dir", ".", "--name", "d", "--version", "1", "--role", "draft"
    )
    assert code == 1 and "--target" in err
    assert stub.calls == []


def test_unreachable_server_exits_1() -> None:
    out, err = io.StringIO(), io.StringIO()
    code = main(["--url", "http://127.0.0.1:9", "models", "list"], stdout=out, stderr=err)
    assert code == 1 and "cannot reach" in err.getvalue()


def test_python_dash_m_with_environment(stub: Stub) -> None:
    env = {**os.environ, "GATEWAY_URL": stub.url, "GATEWAY_ADMIN_KEY": KEY}
    root = Path(__file__).resolve().parents[3]
    proc = subprocess.run(
        [sys.executable, "-m", "models_registry", "rollouts", "show", "ro-1"],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == ROLLOUT
