"""The built-in decoders, one module each: a model's outputs -> the `result` object of a message.

Each module registers its type key, its config model (which says what it `PRODUCES`: classes, detections,
segments or raw) and its factory with `POSTPROCESSORS` (edged/model/postprocess.py); the registry imports
every module here when it is first read, and plugins through the `edged.postprocessors` entry point, the
same way. Adding a decoder is adding a file here (docs/architecture.md, "Adding a decoder").
"""
