"""The KServe v2 gRPC protocol (GRPCInferenceService from tritonclient's generated modules) and gRPC health."""
