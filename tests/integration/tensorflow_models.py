"""Small TensorFlow models that the TensorFlow backend's tests and benchmark build into temporary repositories: a
dense SavedModel, one with string tensors, one with two signatures, a Keras 3 export and a frozen GraphDef (with
an init op). Each builder writes the model and returns a callable that runs the same model in-process, so a test
compares the server's answer with TensorFlow's own.

TensorFlow is imported inside the builders: importing this module costs nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["dense_savedmodel", "string_savedmodel", "two_signature_savedmodel", "keras_export", "graphdef", "mlp_savedmodel"]

Reference = Callable[..., dict[str, np.ndarray]]


def _tf() -> Any:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    return tf


def _signature_reference(path: Path, key: str = "serving_default") -> Reference:
    """The SavedModel loaded back in-process: the signature called with numpy inputs, numpy outputs out."""
    tf = _tf()
    function = tf.saved_model.load(str(path)).signatures[key]

    def run(**inputs: np.ndarray) -> dict[str, np.ndarray]:
        return {k: v.numpy() for k, v in function(**{k: tf.constant(v) for k, v in inputs.items()}).items()}

    return run


def dense_savedmodel(path: Path, features: int = 8, outputs: int = 3) -> Reference:
    """y = relu(x·W1 + b)·W2 with a variable batch dimension: x [-1, features] FP32 -> y [-1, outputs]."""
    tf = _tf()
    rng = np.random.default_rng(1)

    class Dense(tf.Module):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.w1 = tf.Variable(rng.standard_normal((features, 16)).astype(np.float32))
            self.b = tf.Variable(rng.standard_normal(16).astype(np.float32))
            self.w2 = tf.Variable(rng.standard_normal((16, outputs)).astype(np.float32))

        @tf.function(input_signature=[tf.TensorSpec([None, features], tf.float32, name="x")])
        def serve(self, x: Any) -> dict[str, Any]:
            return {"y": tf.nn.relu(x @ self.w1 + self.b) @ self.w2}

    module = Dense()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    return _signature_reference(path)


def mlp_savedmodel(path: Path, sizes: tuple[int, ...] = (256, 1024, 1024, 16)) -> Reference:
    """A benchmark-sized MLP (about 5 MB of FP32 weights with the default sizes): x [-1, sizes[0]] -> y."""
    tf = _tf()
    rng = np.random.default_rng(0)

    class MLP(tf.Module):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.layers = [
                (tf.Variable((rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32)), tf.Variable(np.zeros(b, np.float32)))
                for a, b in zip(sizes, sizes[1:], strict=False)
            ]

        @tf.function(input_signature=[tf.TensorSpec([None, sizes[0]], tf.float32, name="x")])
        def serve(self, x: Any) -> dict[str, Any]:
            for index, (w, b) in enumerate(self.layers):
                x = x @ w + b
                if index < len(self.layers) - 1:
                    x = tf.nn.relu(x)
            return {"y": x}

    module = MLP()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    return _signature_reference(path)


def string_savedmodel(path: Path) -> Reference:
    """BYTES in and out, one string per batch item: text [-1] -> upper [-1] (tf.string), length [-1] (INT32)."""
    tf = _tf()

    class Strings(tf.Module):  # type: ignore[misc,name-defined]
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
        def serve(self, text: Any) -> dict[str, Any]:
            return {"upper": tf.strings.upper(text), "length": tf.strings.length(text, unit="UTF8_CHAR")}

    module = Strings()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    return _signature_reference(path)


def two_signature_savedmodel(path: Path) -> tuple[Reference, Reference]:
    """Two signatures on one model: serving_default doubles a [-1, 4] tensor; "scaled" takes two inputs
    (a [-1, 4] FP32 and a [-1, 1] INT64 factor) and gives the product and its sum."""
    tf = _tf()

    class TwoSignatures(tf.Module):  # type: ignore[misc,name-defined]
        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
        def double(self, x: Any) -> dict[str, Any]:
            return {"doubled": x * 2.0}

        @tf.function(input_signature=[
            tf.TensorSpec([None, 4], tf.float32, name="values"), tf.TensorSpec([None, 1], tf.int64, name="factor"),
        ])
        def scaled(self, values: Any, factor: Any) -> dict[str, Any]:
            product = values * tf.cast(factor, tf.float32)
            return {"product": product, "total": tf.reduce_sum(product, axis=1, keepdims=True)}

    module = TwoSignatures()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.double, "scaled": module.scaled})
    return _signature_reference(path), _signature_reference(path, "scaled")


def keras_export(path: Path, features: int = 6, classes: int = 3) -> Reference:
    """A Keras 3 functional model exported with `model.export` (its serving signature, input 'features'); the
    reference is the Keras model itself."""
    _tf()
    import keras

    keras.utils.set_random_seed(3)
    inputs = keras.Input(shape=(features,), name="features")
    hidden = keras.layers.Dense(12, activation="relu")(inputs)
    probabilities = keras.layers.Dense(classes, activation="softmax")(hidden)
    model = keras.Model(inputs, probabilities)
    model.export(str(path), verbose=False)

    def run(**inputs: np.ndarray) -> dict[str, np.ndarray]:
        return {"output_0": np.asarray(model(inputs["features"]))}

    return run


def graphdef(path: Path, features: int = 6, outputs: int = 4) -> Reference:
    """A GraphDef: Placeholder x [-1, features] FP32 -> out [-1, outputs] = x·W + bias, where bias is a variable
    that only the graph's 'init' op sets (so the model answers only once TF_INIT_OPS_FILE's op has run)."""
    tf = _tf()
    rng = np.random.default_rng(2)
    weights = rng.standard_normal((features, outputs)).astype(np.float32)
    bias = np.arange(outputs, dtype=np.float32)
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, features], name="x")
        b = tf.compat.v1.Variable(bias, name="bias", use_resource=False)
        tf.identity(tf.matmul(x, tf.constant(weights)) + b, name="out")
        tf.compat.v1.variables_initializer([b], name="init")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(graph.as_graph_def().SerializeToString())

    def run(**inputs: np.ndarray) -> dict[str, np.ndarray]:
        with tf.compat.v1.Session(graph=graph) as session:
            session.run("init")
            return {"out": session.run("out:0", {"x:0": inputs["x"]})}

    return run
