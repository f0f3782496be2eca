"""Stage 5, the uplink: rows from the store enter, MQTT messages leave; PUBACKs go back to the store.

The paho connection (TLS, auth, reconnect with backoff), the in-flight window and the drain.
"""
