"""The response cache: identical requests (model, version, inputs, parameters) answered without executing."""
