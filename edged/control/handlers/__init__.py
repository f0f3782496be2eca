"""The remote commands, one module each: its arguments' model and its handler, registered under the
command's name with `HANDLERS` (edged/control/dispatch.py), which imports every module here. Adding a
command is a module here and its name in edged/control/names.py (what `edged fleet send` offers)."""
