"""Merging the replicas' answers to calls that concern all of them into the one answer a single Triton server
gives: statistics summed per model version, and one repository index row per model version. Pure functions
over plain JSON-shaped data; they call nothing."""

from __future__ import annotations

from typing import Any

__all__ = ["merge_index", "merge_statistics"]

# The index states by how much they say: a model READY on any replica is READY for the cluster.
_STATE_RANK = {"READY": 4, "LOADING": 3, "UNLOADING": 2, "UNAVAILABLE": 1}


# What names an entry of a list (a batch size, a memory kind and device): kept, never summed.
_IDENTITY = frozenset({"batch_size", "type", "id"})


def _add(into: dict[str, Any], other: dict[str, Any]) -> None:
    for key, value in other.items():
        mine = into.get(key)
        if key == "last_inference":
            into[key] = max(mine or 0, value)
        elif key in _IDENTITY or isinstance(value, bool | str):
            into.setdefault(key, value)
        elif isinstance(value, int | float):
            into[key] = (mine or 0) + value
        elif isinstance(value, dict):
            if not isinstance(mine, dict):
                into[key] = mine = {}
            _add(mine, value)
        elif isinstance(value, list):
            if not isinstance(mine, list):
                into[key] = mine = []
            _merge_list(mine, value)


def _merge_list(into: list[Any], other: list[Any]) -> None:
    """Batch statistics merge by batch size; memory usage entries by kind and id; anything else is appended."""
    for item in other:
        key = _list_key(item)
        match = next((mine for mine in into if key is not None and _list_key(mine) == key), None)
        if match is None:
            into.append(_copy(item))
        else:
            _add(match, item)


def _list_key(item: Any) -> Any:
    if not isinstance(item, dict):
        return None
    if "batch_size" in item:
        return ("batch_size", item["batch_size"])
    if "type" in item and "id" in item:
        return ("memory", item["type"], item["id"])
    return None


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def merge_statistics(answers: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each replica's `statistics()` list -> one list, a model version's counts and durations summed over the
    replicas that hold it (the latest last_inference kept), in Triton's order: by name, then version."""
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for answer in answers:
        for entry in answer:
            key = (entry.get("name", ""), entry.get("version", ""))
            if key not in merged:
                merged[key] = _copy(entry)
            else:
                _add(merged[key], {k: v for k, v in entry.items() if k not in ("name", "version")})
    return [merged[key] for key in sorted(merged, key=lambda k: (k[0], int(k[1]) if k[1].isdigit() else 0))]


def merge_index(answers: list[list[dict[str, Any]]], ready_only: bool = False) -> list[dict[str, Any]]:
    """Each replica's repository index -> one: per model version the row that says most (READY on any replica
    wins), a model no replica has loaded as the bare `{"name": ...}` row every replica lists."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for answer in answers:
        for row in answer:
            key = (row["name"], row.get("version", ""))
            held = rows.get(key)
            if held is None or _STATE_RANK.get(row.get("state", ""), 0) > _STATE_RANK.get(held.get("state", ""), 0):
                rows[key] = dict(row)
    names_with_versions = {name for name, version in rows if version}
    out = []
    for (name, version), row in sorted(
        rows.items(), key=lambda kv: (kv[0][0], int(kv[0][1]) if kv[0][1].isdigit() else -1)
    ):
        if not version and name in names_with_versions and "state" not in row:
            continue  # another replica knows this model's versions: its bare row says less
        if ready_only and row.get("state") != "READY":
            continue
        out.append(row)
    return out
