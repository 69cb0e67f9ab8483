"""The metadata every table of the gateway joins (`Base`, with its naming convention) and
the column types they share: 64-bit ids, UTC timestamps, payload text that round-trips NUL
on PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import BigInteger, DateTime, Dialect, Integer, MetaData, Table, Text, TypeDecorator
from sqlalchemy.orm import DeclarativeBase

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

#: 64-bit ids on PostgreSQL; SQLite needs INTEGER for its rowid alias.
BigId = BigInteger().with_variant(Integer(), "sqlite")


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC in, timezone-aware UTC out, on every dialect."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.utcoffset() is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)  # type: ignore[no-any-return]
        return value.astimezone(UTC)  # type: ignore[no-any-return]


class PayloadText(TypeDecorator[str]):
    """Any Python str, on every dialect. PostgreSQL text cannot hold NUL, yet a model may
    emit it (byte-level tokenizers have a token for byte 0), and an unwritable completion
    would refuse the request (fail closed). So on PostgreSQL NUL is stored as "\u2400 0"
    (SYMBOL FOR NULL, then "0") and a literal U+2400 as two of them; reads undo both, so the
    text (and its SHA-256 in the chain) round-trips exactly. Text without either is stored
    unchanged."""

    impl = Text
    cache_ok = True
    _ESC = "\u2400"

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        if value is None or dialect.name != "postgresql":
            return value
        if "\x00" not in value and self._ESC not in value:
            return value
        return value.replace(self._ESC, self._ESC * 2).replace("\x00", self._ESC + "0")

    def process_result_value(self, value: Any, dialect: Dialect) -> str | None:
        if value is None or dialect.name != "postgresql" or self._ESC not in value:
            return value  # type: ignore[no-any-return]
        out, i = [], 0
        while i < len(value):
            ch = value[i]
            if ch == self._ESC and i + 1 < len(value):
                out.append("\x00" if value[i + 1] == "0" else self._ESC)
                i += 2
            else:
                out.append(ch)
                i += 1
        return "".join(out)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


def table_of(model: type[Base]) -> Table:
    """The Core table of an ORM row class (what the stores' queries use)."""
    return cast(Table, model.__table__)
