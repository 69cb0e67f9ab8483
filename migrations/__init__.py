"""Alembic migrations of the gateway database (metadata: gateway.audit.models)."""
