"""The backends Nereid serves, each declared once: its name, the module that implements it, the pip extra that
installs its framework, the Triton platforms it serves and its default file names. The lookup tables of
config, repository and backends are derived from here. Data only: it never imports a backend."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "BackendEntry",
    "BACKENDS",
    "PLATFORM_TO_BACKEND",
    "BACKEND_TO_PLATFORM",
    "DEFAULT_MODEL_FILENAMES",
    "DEFAULT_MODEL_FILENAMES_BY_PLATFORM",
    "BACKEND_BY_FILE",
]


@dataclass(frozen=True, slots=True)
class BackendEntry:
    name: str
    # The module (or package) whose BACKEND (or new_backend(), one per Server) implements it, imported only when a
    # model needs it.
    module: str
    extra: str | None = None  # the pip extra that installs its framework
    platforms: tuple[str, ...] = ()  # Triton platform names it serves
    # A config naming only the backend gets platforms[0] as its platform, as Triton's auto-complete fills it.
    fills_platform: bool = False
    # What a config without default_model_filename gets (Triton fills it in for these backends only).
    default_model_filename: str = ""
    # Files whose presence in a version folder names this backend when a config names none.
    model_files: tuple[str, ...] = ()
    # A backend whose default file depends on the platform (TensorFlow: a SavedModel folder or a GraphDef file):
    # (platform, default_model_filename) pairs, which win over default_model_filename.
    platform_model_filenames: tuple[tuple[str, str], ...] = ()


# In the order a version folder's files are tried when a config names no backend.
_ENTRIES = (
    BackendEntry(
        "onnxruntime",
        "nereid.backends.onnxruntime_backend",
        platforms=("onnxruntime_onnx",),
        fills_platform=True,
        default_model_filename="model.onnx",
        model_files=("model.onnx",),
    ),
    BackendEntry("python", "nereid.backends.python", default_model_filename="model.py", model_files=("model.py",)),
    BackendEntry(
        "pytorch",
        "nereid.backends.pytorch_backend",
        "pytorch",
        platforms=("pytorch_libtorch", "pytorch_torchscript"),
        fills_platform=True,
        default_model_filename="model.pt",
        model_files=("model.pt", "model.pt2"),
    ),
    BackendEntry(
        "openvino", "nereid.backends.openvino_backend", "openvino", platforms=("openvino",), model_files=("model.xml",)
    ),
    # The fil backend's default file names (model.txt, LightGBM's, is too common a name to guess from).
    BackendEntry(
        "fil",
        "nereid.backends.fil",
        "fil",
        model_files=("xgboost.json", "xgboost.ubj", "xgboost.model", "checkpoint.tl"),
    ),
    # Triton's TensorFlow backend: the platform (and so the default file) follows the version folder's files.
    BackendEntry(
        "tensorflow",
        "nereid.backends.tensorflow.backend",
        "tensorflow",
        platforms=("tensorflow_savedmodel", "tensorflow_graphdef"),
        model_files=("model.savedmodel", "model.graphdef"),
        platform_model_filenames=(
            ("tensorflow_savedmodel", "model.savedmodel"),
            ("tensorflow_graphdef", "model.graphdef"),
        ),
    ),
    BackendEntry("vllm", "nereid.backends.llm", "llm"),
    # Functions bound in-process with nereid.pytriton's Triton.bind (no model files).
    BackendEntry("python_function", "nereid.pytriton.backend"),
)

BACKENDS: dict[str, BackendEntry] = {entry.name: entry for entry in _ENTRIES}
PLATFORM_TO_BACKEND: dict[str, str] = {platform: e.name for e in _ENTRIES for platform in e.platforms}
BACKEND_TO_PLATFORM: dict[str, str] = {e.name: e.platforms[0] for e in _ENTRIES if e.fills_platform}
DEFAULT_MODEL_FILENAMES: dict[str, str] = {e.name: e.default_model_filename for e in _ENTRIES if e.default_model_filename}
DEFAULT_MODEL_FILENAMES_BY_PLATFORM: dict[str, str] = {
    platform: filename for e in _ENTRIES for platform, filename in e.platform_model_filenames
}
BACKEND_BY_FILE: dict[str, str] = {filename: e.name for e in _ENTRIES for filename in e.model_files}
