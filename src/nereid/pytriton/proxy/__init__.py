"""The request and response types an inference callable receives and returns (PyTriton's `pytriton.proxy`)."""
