"""Stage 4, the store: result messages enter (with their seq), rows leave for the uplink; a row is deleted
only once the uplink says the broker acknowledged it.

The durable queue (SQLite, WAL), seq leases, bounds/TTL/eviction, dead letters and disk space.
"""
