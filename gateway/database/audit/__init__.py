"""The audit log inside the database: request records and admin events in hash chains
(chain.py), their appends, verification and payload purge (records.py), the compliance
queries (queries.py), the batching writer (writer.py) and the record types (types.py)."""
