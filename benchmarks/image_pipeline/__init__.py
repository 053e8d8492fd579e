"""An image pipeline as one server-side ensemble (realistic-load benchmarks, deployment 3): JPEG decode and resize,
a DETR detector (ResNet-50 backbone, random weights, ONNX), then turning its outputs into labelled boxes."""
