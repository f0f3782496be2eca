"""Stage 2, the model: a tensor enters, a result dict leaves.

ONNX Runtime sessions and providers, image preprocessing and sensor windows (what turns a captured frame
into the model's input), the decoders (classify and raw in `postprocess`, detect, centernet, gfl, text,
segment, detr: each registers itself by its type key, plugins come through an entry point), TensorRT engines.
"""
