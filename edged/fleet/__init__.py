"""The fleet side: what runs off the device. `edged ingest` lands results in a database exactly once."""
