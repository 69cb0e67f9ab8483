"""Shared test support: tiny models (models.py) and batch drivers (batch.py)."""
