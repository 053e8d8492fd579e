"""Three models on one shared server (realistic-load benchmarks, deployment 1): a fraud model (XGBoost through the
fil backend), a DLRM-like recommender (ONNX) and ResNet-50 (ONNX), under mixed traffic."""
