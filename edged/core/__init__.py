"""The shared core every stage may import: errors, units, backoff, counters, thread naming, the config
file reader and the base of every config section. It imports no stage."""
