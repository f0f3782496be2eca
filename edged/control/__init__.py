"""Remote control: signed commands in, results, events and the reported state out (off unless `control:` is
configured). A stage of its own, after the uplink it rides on: the gate checks each command, the controller runs
it against what the daemon hands it at construction (reload, status, frame taps, the config file), rollout
fetches, validates and swaps a model, and envelope.py is the command format both sides share (the device
here, `edged fleet send` on the operator's machine)."""
