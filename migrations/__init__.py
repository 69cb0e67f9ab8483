"""Alembic migrations of the gateway database (metadata: gateway.database.tables)."""
