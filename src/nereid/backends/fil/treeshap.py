"""Path-dependent TreeSHAP over a Treelite model's trees, for the models no framework explains for us.

XGBoost and LightGBM compute SHAP values themselves; Treelite checkpoints and scikit-learn forests come here.
It follows the polynomial-time algorithm of Lundberg et al. ("Consistent individualized feature attribution
for tree ensembles", Algorithm 2) in plain Python: exact, but slow for large forests.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from nereid.core.errors import NereidError

__all__ = ["TreeShap"]


@dataclass(slots=True)
class _Node:
    left: int
    right: int
    feature: int
    threshold: float
    op: str
    default_left: bool
    categories: frozenset[int] | None  # categorical split: these categories go right if right_has_categories
    right_has_categories: bool
    cover: float
    value: np.ndarray | None  # leaf output over all model outputs (zeros where the tree does not contribute)


_OPS = {
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "==": lambda a, b: a == b,
}


class _PathEntry:
    __slots__ = ("feature", "zero", "one", "weight")

    def __init__(self, feature: int, zero: float, one: float, weight: float) -> None:
        self.feature = feature
        self.zero = zero
        self.one = one
        self.weight = weight


def _extend(path: list[_PathEntry], zero: float, one: float, feature: int) -> None:
    depth = len(path)
    path.append(_PathEntry(feature, zero, one, 1.0 if depth == 0 else 0.0))
    for i in range(depth - 1, -1, -1):
        path[i + 1].weight += one * path[i].weight * (i + 1) / (depth + 1)
        path[i].weight = zero * path[i].weight * (depth - i) / (depth + 1)


def _unwind(path: list[_PathEntry], index: int) -> None:
    depth = len(path) - 1
    one, zero = path[index].one, path[index].zero
    carry = path[depth].weight
    for j in range(depth - 1, -1, -1):
        if one != 0:
            saved = path[j].weight
            path[j].weight = carry * (depth + 1) / ((j + 1) * one)
            carry = saved - path[j].weight * zero * (depth - j) / (depth + 1)
        else:
            path[j].weight = path[j].weight * (depth + 1) / (zero * (depth - j))
    for j in range(index, depth):
        path[j].feature, path[j].zero, path[j].one = path[j + 1].feature, path[j + 1].zero, path[j + 1].one
    path.pop()


def _unwound_sum(path: list[_PathEntry], index: int) -> float:
    depth = len(path) - 1
    one, zero = path[index].one, path[index].zero
    carry = path[depth].weight
    total = 0.0
    for j in range(depth - 1, -1, -1):
        if one != 0:
            term = carry * (depth + 1) / ((j + 1) * one)
            total += term
            carry = path[j].weight - term * zero * (depth - j) / (depth + 1)
        elif zero != 0:
            total += path[j].weight * (depth + 1) / (zero * (depth - j))
    return total


class TreeShap:
    """SHAP values in margin space: [rows, outputs, features + 1], the bias (expected margin) last."""

    def __init__(self, model: Any) -> None:
        dump = json.loads(model.dump_as_json())
        self.n_features = int(dump["num_feature"])
        # Splits compare in the model's threshold precision (XGBoost and LightGBM models are float32).
        self._row_type = np.float32 if dump.get("threshold_type") == "float32" else np.float64
        num_class = [int(c) for c in dump["num_class"]]
        self._max_class = max(num_class) if num_class else 1
        self.n_outputs = int(dump["num_target"]) * self._max_class
        self._average = bool(dump.get("average_tree_output", False))
        self._base = np.asarray(dump.get("base_scores", [0.0] * self.n_outputs), dtype=np.float64).reshape(-1)
        target_ids = dump.get("target_id", [])
        class_ids = dump.get("class_id", [])
        self._trees: list[list[_Node]] = []
        self._per_output = np.zeros(self.n_outputs)
        for index, tree in enumerate(dump["trees"]):
            target = target_ids[index] if index < len(target_ids) else -1
            klass = class_ids[index] if index < len(class_ids) else -1
            nodes = self._nodes(tree, target, klass)
            self._trees.append(nodes)
            if target < 0 and klass < 0:
                self._per_output += 1
            else:
                self._per_output[self._slot(target, klass)] += 1
        self._per_output[self._per_output == 0] = 1

    def _slot(self, target: int, klass: int) -> int:
        return max(target, 0) * self._max_class + max(klass, 0)

    def _nodes(self, tree: dict[str, Any], target: int, klass: int) -> list[_Node]:
        nodes: list[_Node] = []
        for raw in sorted(tree["nodes"], key=lambda n: n["node_id"]):
            cover = raw.get("sum_hess", raw.get("data_count"))
            if cover is None:
                raise NereidError.unavailable(
                    "treeshap_output needs node statistics (sum_hess or data_count) that this Treelite model lacks"
                )
            value = None
            if "leaf_value" in raw:
                leaf = raw["leaf_value"]
                value = np.zeros(self.n_outputs)
                if isinstance(leaf, list):
                    if target < 0 and klass < 0:
                        value[: len(leaf)] = leaf
                    else:
                        start = self._slot(target, klass)
                        value[start : start + len(leaf)] = leaf
                else:
                    value[self._slot(target, klass)] = leaf
            categorical = raw.get("node_type") == "categorical_test_node"
            nodes.append(
                _Node(
                    left=int(raw.get("left_child", -1)),
                    right=int(raw.get("right_child", -1)),
                    feature=int(raw.get("split_feature_id", -1)),
                    threshold=float(raw.get("threshold", 0.0)),
                    op=raw.get("comparison_op", "<"),
                    default_left=bool(raw.get("default_left", False)),
                    categories=frozenset(int(c) for c in raw.get("category_list", [])) if categorical else None,
                    right_has_categories=bool(raw.get("category_list_right_child", False)),
                    cover=float(cover),
                    value=value,
                )
            )
        return nodes

    @staticmethod
    def _goes_left(node: _Node, value: float) -> bool:
        if math.isnan(value):
            return node.default_left
        if node.categories is not None:
            inside = value >= 0 and float(value).is_integer() and int(value) in node.categories
            return inside != node.right_has_categories
        return bool(_OPS[node.op](value, node.threshold))

    def expected_value(self) -> np.ndarray:
        total = np.zeros(self.n_outputs)
        for nodes in self._trees:
            root = nodes[0].cover
            total += sum(n.value * (n.cover / root) for n in nodes if n.value is not None)
        return total / (self._per_output if self._average else 1) + self._base

    def shap_values(self, rows: np.ndarray) -> np.ndarray:
        result = np.zeros((len(rows), self.n_outputs, self.n_features + 1), dtype=np.float64)
        bias = self.expected_value()
        scale = self._per_output if self._average else np.ones(self.n_outputs)
        for r, row in enumerate(np.asarray(rows, dtype=self._row_type).astype(np.float64)):
            phi = np.zeros((self.n_features, self.n_outputs))
            for nodes in self._trees:
                self._recurse(nodes, 0, row, phi, [], 1.0, 1.0, -1)
            result[r, :, : self.n_features] = (phi / scale).T
            result[r, :, self.n_features] = bias
        return result

    def _recurse(
        self,
        nodes: list[_Node],
        index: int,
        row: np.ndarray,
        phi: np.ndarray,
        parent_path: list[_PathEntry],
        zero: float,
        one: float,
        feature: int,
    ) -> None:
        path = [_PathEntry(e.feature, e.zero, e.one, e.weight) for e in parent_path]
        _extend(path, zero, one, feature)
        node = nodes[index]
        if node.value is not None:
            for i in range(1, len(path)):
                weight = _unwound_sum(path, i)
                entry = path[i]
                phi[entry.feature] += weight * (entry.one - entry.zero) * node.value
            return
        hot, cold = (node.left, node.right) if self._goes_left(node, row[node.feature]) else (node.right, node.left)
        incoming_zero, incoming_one = 1.0, 1.0
        for k in range(1, len(path)):
            if path[k].feature == node.feature:
                incoming_zero, incoming_one = path[k].zero, path[k].one
                _unwind(path, k)
                break
        cover = node.cover if node.cover > 0 else 1.0
        self._recurse(nodes, hot, row, phi, path, incoming_zero * nodes[hot].cover / cover, incoming_one, node.feature)
        self._recurse(nodes, cold, row, phi, path, incoming_zero * nodes[cold].cover / cover, 0.0, node.feature)
