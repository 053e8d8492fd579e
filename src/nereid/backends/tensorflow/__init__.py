"""Triton's TensorFlow backend for SavedModels (`tensorflow_savedmodel`) and GraphDefs (`tensorflow_graphdef`).

`signature` (what a model's tensors are) and `autocomplete` import no TensorFlow; `runtime` imports it when the
first TensorFlow model loads; `backend` is what the registry names.
"""
