"""Operations beside the dataflow: the status socket and its view, systemd notify/watchdog, logging,
the state-dir lock and reload (which talks only to the pipeline runners)."""
