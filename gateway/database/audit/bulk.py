"""The checkpoint job's bulk statements, straight to the driver: it sequences thousands of
chain rows a run, and per-row statement and result handling was most of its cost.

- :func:`insert_rows`: rows into a table; on asyncpg one binary ``COPY`` (no Bind and
  Execute per row: a fraction of ``executemany``'s server and client CPU), elsewhere one
  ``executemany`` of a plain ``INSERT``.
- :func:`fetch_rows`: a query's rows as the driver's tuples, through the DBAPI cursor (no
  result objects).

Both run inside the caller's transaction (the same connection) and raise SQLAlchemy's
errors (``DBAPIError.instance``), as ``Connection.execute`` would.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError


def placeholders(conn: Connection, n: int) -> str:
    """``n`` bind markers in the driver's own style (SQLite ``?``, asyncpg ``$1``)."""
    style = conn.dialect.paramstyle
    if style == "qmark":
        return ", ".join("?" * n)
    if style.startswith("numeric"):  # asyncpg's adapter: $1, $2 ...
        return ", ".join(f"${i}" for i in range(1, n + 1))
    return ", ".join(["%s"] * n)


def _error(conn: Connection, statement: str, exc: Exception) -> Exception:
    return DBAPIError.instance(statement, None, exc, conn.dialect.loaded_dbapi.Error)


def insert_rows(
    conn: Connection, table: str, columns: Sequence[str], rows: list[tuple[Any, ...]]
) -> None:
    """Insert ``rows`` (plain tuples in ``columns`` order) into ``table``."""
    if not rows:
        return
    raw = conn.connection.dbapi_connection
    if conn.dialect.driver == "asyncpg" and raw is not None:
        driver = raw.driver_connection
        if not driver.is_in_transaction():  # the adapter begins at its first statement
            conn.exec_driver_sql("SELECT 1")
        if driver.is_in_transaction():  # the caller's (an autocommit one gets executemany)
            try:
                raw.run_async(  # type: ignore[attr-defined]
                    lambda pg: pg.copy_records_to_table(table, records=rows, columns=columns)
                )
            except Exception as exc:
                raise _error(conn, f"COPY {table}", exc) from exc
            return
    marks = placeholders(conn, len(columns))
    sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})"
    conn.exec_driver_sql(sql, rows)


def fetch_rows(conn: Connection, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
    """Every row of ``sql`` (its bind markers from :func:`placeholders`) as the driver
    returns them."""
    cursor = conn.connection.cursor()
    try:
        cursor.execute(sql, params)
        return list(cursor.fetchall())
    except conn.dialect.loaded_dbapi.Error as exc:
        raise _error(conn, sql, exc) from exc
    finally:
        cursor.close()
