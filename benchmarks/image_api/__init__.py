"""The high-traffic image API of the realistic-load benchmarks: ResNet-50 (random weights) served with dynamic
batching by Nereid, Ray Serve and LitServe, each driven by the same load generator."""
