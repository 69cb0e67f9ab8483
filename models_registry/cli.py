"""Command-line client of the gateway's admin API (HTTP through the standard library), and the
manifest entry of a local model directory.

    python -m models_registry models list
    python -m models_registry models register --dir D --name N --version V --role draft --target T
    python -m models_registry models entry --dir D --name N --role target   (offline)
    python -m models_registry rollouts list | show ID | promote|pause|resume|rollback ID
    python -m models_registry rollouts start --target T --draft D --version V \\
        --canary-percent P [--sticky] [--guard-json '{"min_samples": 200}' | @guard.json]

The base URL comes from --url or $GATEWAY_URL (default http://127.0.0.1:8000), the admin key
from --admin-key or $GATEWAY_ADMIN_KEY. Responses print as JSON on stdout; a non-2xx answer
prints its error message on stderr and exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import yaml

from models_registry.errors import InvalidConfig, RegistryError
from models_registry.guard import Guard
from models_registry.weights import read_config, sha256_files, weights_info

DEFAULT_URL = "http://127.0.0.1:8000"


class ApiError(Exception):
    """A failed call: HTTP status (0 when the server was unreachable) and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def error_message(status: int, body: bytes) -> str:
    """The message of an OpenAI-shaped error body, or the raw body when it is not one."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        data = None
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
        if data.get("detail"):
            return str(data["detail"])
    text = body.decode("utf-8", errors="replace").strip()
    return text or f"HTTP {status}"


def call(
    base_url: str, admin_key: str | None, method: str, path: str, payload: object = None
) -> Any:
    """One admin API call; returns the decoded JSON (None for an empty body)."""
    url = base_url.rstrip("/") + path
    data = None if payload is None else json.dumps(payload).encode()
    headers = {"Accept": "application/json"}
    if data is not None:
        headers["Content-Type"] = "application/json"
    if admin_key:
        headers["Authorization"] = f"Bearer {admin_key}"
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        raise ApiError(exc.code, error_message(exc.code, exc.read())) from None
    except urllib.error.URLError as exc:
        raise ApiError(0, f"cannot reach {url}: {exc.reason}") from None
    return json.loads(body) if body.strip() else None


def parse_guard(text: str | None) -> dict[str, Any] | None:
    """--guard-json: inline JSON or @file; validated (and defaults filled) by ``Guard``."""
    if text is None:
        return None
    if text.startswith("@"):
        text = Path(text[1:]).read_text(encoding="utf-8")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidConfig(f"--guard-json is not valid JSON: {exc}") from exc
    return Guard.from_dict(raw).to_dict()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m models_registry",
        description="Admin client for the gateway's model registry and draft rollouts.",
    )
    parser.add_argument("--url", default=os.environ.get("GATEWAY_URL", DEFAULT_URL))
    parser.add_argument("--admin-key", default=os.environ.get("GATEWAY_ADMIN_KEY"))
    groups = parser.add_subparsers(dest="group", required=True)

    models = groups.add_parser("models", help="registered model versions")
    models_cmd = models.add_subparsers(dest="command", required=True)
    models_cmd.add_parser("list", help="list models")
    reg = models_cmd.add_parser("register", help="register a local model directory")
    reg.add_argument("--dir", required=True, help="model directory (sent as an absolute path)")
    reg.add_argument("--name", required=True)
    reg.add_argument("--version", required=True)
    reg.add_argument("--role", required=True, choices=["target", "draft"])
    reg.add_argument("--target", help="target model name (drafts)")
    entry = models_cmd.add_parser(
        "entry", help="print the manifest entry of a local model directory (offline: its "
        "checksum, architecture and size; no gateway needed)",
    )  # fmt: skip
    entry.add_argument("--dir", required=True, help="model directory")
    entry.add_argument("--name", required=True)
    entry.add_argument("--version", default="1")
    entry.add_argument("--role", required=True, choices=["target", "draft"])
    entry.add_argument("--target", help="target model name (drafts)")

    rollouts = groups.add_parser("rollouts", help="draft rollouts")
    ro_cmd = rollouts.add_subparsers(dest="command", required=True)
    ro_cmd.add_parser("list", help="list rollouts")
    for verb in ("show", "promote", "pause", "resume", "rollback"):
        ro_cmd.add_parser(verb, help=f"{verb} a rollout").add_argument("id")
    start = ro_cmd.add_parser("start", help="start a canary rollout")
    start.add_argument("--target", required=True)
    start.add_argument("--draft", required=True)
    start.add_argument("--version", required=True)
    start.add_argument("--canary-percent", required=True, type=float)
    start.add_argument("--sticky", action="store_true", help="split by tenant, not request")
    start.add_argument("--guard-json", help="guard thresholds as JSON, or @file")
    return parser


def manifest_entry(args: argparse.Namespace) -> str:
    """The YAML of one manifest entry for ``args.dir``: its weights' SHA-256 (the file, or
    the shards concatenated in name order, as the gateway checks them at load) and what its
    config and weights say of it."""
    if args.role == "draft" and not args.target:
        raise InvalidConfig("--target is required for --role draft")
    where = Path(args.dir).expanduser().resolve()
    info, cfg = weights_info(where), read_config(where)
    entry: dict[str, object] = {
        "name": args.name, "version": str(args.version), "role": args.role,
        "path": str(where), "sha256": sha256_files(info.files),
    }  # fmt: skip
    if args.target:
        entry["target"] = args.target
    extra = {"architecture": cfg.architecture, "layers": cfg.layers, "hidden": cfg.hidden,
             "parameters": info.parameters, "dtype": info.dtype}  # fmt: skip
    entry.update({k: v for k, v in extra.items() if v is not None})
    return yaml.safe_dump({"models": [entry]}, sort_keys=False)


def request_for(args: argparse.Namespace) -> tuple[str, str, object]:
    """(method, path, payload) of the parsed command."""
    if args.group == "models":
        if args.command == "list":
            return "GET", "/admin/models", None
        if args.role == "draft" and not args.target:
            raise InvalidConfig("--target is required for --role draft")
        payload = {
            "name": args.name,
            "version": args.version,
            "role": args.role,
            "target": args.target,
            "path": str(Path(args.dir).expanduser().resolve()),
        }
        return "POST", "/admin/models", payload
    if args.command == "list":
        return "GET", "/admin/rollouts", None
    if args.command == "start":
        if not 0 <= args.canary_percent <= 100:
            raise InvalidConfig("--canary-percent must be between 0 and 100")
        payload = {
            "target": args.target,
            "draft": args.draft,
            "version": args.version,
            "canary_percent": args.canary_percent,
            "sticky": args.sticky,
        }
        guard = parse_guard(args.guard_json)
        if guard is not None:
            payload["guard"] = guard
        return "POST", "/admin/rollouts", payload
    rid = urllib.parse.quote(args.id, safe="")
    if args.command == "show":
        return "GET", f"/admin/rollouts/{rid}", None
    return "POST", f"/admin/rollouts/{rid}/{args.command}", None


def main(
    argv: Sequence[str] | None = None, stdout: TextIO | None = None, stderr: TextIO | None = None
) -> int:
    out, err = stdout or sys.stdout, stderr or sys.stderr
    args = build_parser().parse_args(argv)
    if args.group == "models" and args.command == "entry":
        try:
            print(manifest_entry(args), file=out, end="")
        except (RegistryError, InvalidConfig, OSError) as exc:
            print(f"error: {exc}", file=err)
            return 1
        return 0
    try:
        method, path, payload = request_for(args)
        result = call(args.url, args.admin_key, method, path, payload)
    except (ApiError, InvalidConfig, OSError) as exc:
        print(f"error: {exc}", file=err)
        return 1
    print(json.dumps(result, indent=2, sort_keys=True), file=out)
    return 0
