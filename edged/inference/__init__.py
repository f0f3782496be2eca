"""Running ONNX models: sessions and providers, preprocessing, postprocessing."""
