"""structlog JSON logs: one line per request with request id, tenant, decision id and mode.
Never prompt or completion text."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog


def configure(level: str) -> None:
    logging.basicConfig(stream=sys.stderr, level=level.upper(), format="%(message)s")
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )


_log = structlog.get_logger("gateway.requests")


def log_request(observed: Any) -> None:
    """Recorder listener: the request line of the JSON log."""
    record = observed.record
    _log.info(
        "request",
        request_id=record.request_id,
        tenant=record.tenant_id,
        decision_id=record.decision_id,
        endpoint=record.endpoint,
        status=record.status,
        mode=record.mode,
        proposer=record.proposer,
        draft=f"{record.draft_model}@{record.draft_version}" if record.draft_model else None,
        prompt_tokens=record.prompt_tokens,
        completion_tokens=record.completion_tokens,
        drafted=record.drafted_tokens,
        accepted=record.accepted_tokens,
        latency_ms=record.latency_ms,
        ttft_ms=record.ttft_ms,
        error=record.error_type,
        trace_id=record.trace_id,
    )
