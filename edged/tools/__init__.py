"""The model toolchain: `edged inspect`, `quantize`, `validate`, `bench` and `budget`.

One module per tool; `common` and `frames` hold what they share. Every tool returns a plain report
(JSON-able dict) and has a `render_*` function printing it as rich tables, so `--json` and the terminal
show the same numbers.
"""

# Kept here (not in quantize.py) so the CLI can list the choices without importing onnxruntime.
CALIBRATION_METHODS = ("minmax", "entropy", "percentile")
QUANT_TYPES = ("int8", "uint8")
