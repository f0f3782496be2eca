"""Stage 2, the model: a tensor enters, a result dict leaves.

ONNX Runtime sessions and providers, image preprocessing and sensor windows (what turns a captured frame
into the model's input), postprocessing (classify, detect, raw: registered by type key), TensorRT engines.
"""
