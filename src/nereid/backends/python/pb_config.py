"""pb_utils' model-configuration helpers: lookups in a model's config (as JSON or a dict), and the ModelConfig that
auto_complete_config(auto_complete_model_config) receives and fills in. Runs in the worker: no server imports."""

from __future__ import annotations

import json
from typing import Any

__all__ = [
    "ModelConfig",
    "get_input_config_by_name",
    "get_output_config_by_name",
    "using_decoupled_model_transaction_policy",
]


def _config_dict(model_config: dict[str, Any] | str) -> dict[str, Any]:
    return json.loads(model_config) if isinstance(model_config, str) else model_config


def get_input_config_by_name(model_config: dict[str, Any] | str, name: str) -> dict[str, Any] | None:
    for entry in _config_dict(model_config).get("input", []):
        if entry.get("name") == name:
            return entry  # type: ignore[no-any-return]
    return None


def get_output_config_by_name(model_config: dict[str, Any] | str, name: str) -> dict[str, Any] | None:
    for entry in _config_dict(model_config).get("output", []):
        if entry.get("name") == name:
            return entry  # type: ignore[no-any-return]
    return None


def using_decoupled_model_transaction_policy(model_config: dict[str, Any] | str) -> bool:
    policy = _config_dict(model_config).get("model_transaction_policy") or {}
    return bool(policy.get("decoupled", False))


class ModelConfig:
    """What `auto_complete_config(auto_complete_model_config)` receives: the config so far, and ways to fill it in."""

    def __init__(self, model_config: dict[str, Any] | str) -> None:
        self._config: dict[str, Any] = _config_dict(model_config)
        self._config.setdefault("input", [])
        self._config.setdefault("output", [])
        self._config.setdefault("max_batch_size", 0)

    def _model(self) -> str:
        return str(self._config.get("name", ""))

    def as_dict(self) -> dict[str, Any]:
        return self._config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        configured = int(self._config.get("max_batch_size", 0))
        if configured > max_batch_size:
            raise ValueError(
                f"model '{self._model()}': auto_complete_config sets max_batch_size {max_batch_size}, below the "
                f"max_batch_size {configured} that the configuration asks for"
            )
        self._config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._config:
                raise ValueError(
                    f"model '{self._model()}': auto_complete_config asks for dynamic_batching but the configuration "
                    f"already uses '{other}'"
                )
        self._config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:  # noqa: A002 - Triton's parameter name
        self._add_tensor("input", input, ("name", "data_type", "dims", "optional"))

    def add_output(self, output: dict[str, Any]) -> None:
        self._add_tensor("output", output, ("name", "data_type", "dims"))

    def _add_tensor(self, kind: str, tensor: dict[str, Any], allowed: tuple[str, ...]) -> None:
        model = self._model()
        label = f"{kind} '{tensor.get('name', '')}'"
        unknown = [key for key in tensor if key not in allowed]
        if unknown:
            raise ValueError(
                f"model '{model}': auto_complete_config {label} has properties {unknown}; only {list(allowed)} may be set"
            )
        for required in ("name", "data_type", "dims"):
            if required not in tensor:
                raise ValueError(f"model '{model}': auto_complete_config {label} is missing '{required}'")
        for existing in self._config.setdefault(kind, []):
            if existing.get("name") != tensor["name"]:
                continue
            configured_type = existing.get("data_type", "TYPE_INVALID")
            if configured_type not in ("TYPE_INVALID", tensor["data_type"]):
                raise ValueError(
                    f"model '{model}', {label}: the configuration says data_type {configured_type} but the model "
                    f"says {tensor['data_type']}"
                )
            configured_dims = existing.get("dims") or []
            if configured_dims and list(configured_dims) != list(tensor["dims"]):
                raise ValueError(
                    f"model '{model}', {label}: the configuration says dims {list(configured_dims)} but the model "
                    f"says {list(tensor['dims'])}"
                )
            if "optional" in existing and "optional" in tensor and existing["optional"] != tensor["optional"]:
                raise ValueError(
                    f"model '{model}', {label}: the configuration says optional {existing['optional']} but the "
                    f"model says {tensor['optional']}"
                )
            existing["data_type"] = tensor["data_type"]
            existing["dims"] = list(tensor["dims"])
            if "optional" in tensor:
                existing["optional"] = tensor["optional"]
            return
        self._config[kind].append(dict(tensor))

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        model = self._model()
        unknown = [key for key in transaction_policy_dict if key != "decoupled"]
        if unknown:
            raise ValueError(
                f"model '{model}': auto_complete_config model_transaction_policy has properties {unknown}; only "
                f"'decoupled' may be set"
            )
        policy = self._config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = bool(transaction_policy_dict["decoupled"])
            if "decoupled" in policy and bool(policy["decoupled"]) != wanted:
                raise ValueError(
                    f"model '{model}': auto_complete_config cannot change 'decoupled', which the configuration "
                    f"sets to {policy['decoupled']}"
                )
            policy["decoupled"] = wanted
