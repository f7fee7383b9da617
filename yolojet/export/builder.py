"""Incremental graph construction: converters add nodes here and get back the names of their outputs."""

from __future__ import annotations

from typing import Any

import numpy as np

from yolojet.ir import BATCH, Graph, ModelMeta, Node, Shape, Value, infer_shapes


class GraphBuilder:
    """Collects nodes, values and weights; infers every output shape as the node is added."""

    def __init__(self, input_name: str, input_shape: Shape) -> None:
        self.values: dict[str, Value] = {input_name: Value(input_name, tuple(input_shape))}
        self.nodes: list[Node] = []
        self.weights: dict[str, np.ndarray] = {}
        self.input = input_name
        self._taken: set[str] = {input_name}

    def shape(self, value: str) -> Shape:
        return self.values[value].shape

    def channels(self, value: str) -> int:
        return int(self.values[value].shape[1])

    def add(
        self,
        op: str,
        inputs: list[str],
        *,
        source: str,
        attrs: dict[str, Any] | None = None,
        weights: dict[str, np.ndarray] | None = None,
        num_outputs: int = 1,
    ) -> list[str]:
        """Append a node and return its output value names (one per output)."""
        name = self._unique_name(f"{source}/{op}" if source else op)
        outputs = [name] if num_outputs == 1 else [f"{name}:{i}" for i in range(num_outputs)]
        weight_keys = {}
        for role, array in (weights or {}).items():
            key = f"{name}.{role}"
            self.weights[key] = np.ascontiguousarray(array, dtype=np.float32)
            weight_keys[role] = key
        node = Node(name, op, list(inputs), outputs, dict(attrs or {}), weight_keys, source)
        weight_shapes = {role: tuple(self.weights[key].shape) for role, key in weight_keys.items()}
        shapes = infer_shapes(node, [self.values[i].shape for i in inputs], weight_shapes)
        for value_name, shape in zip(outputs, shapes, strict=True):
            self.values[value_name] = Value(value_name, tuple(shape))
        self.nodes.append(node)
        return list(outputs)  # a copy: callers extend it, the node must keep its own

    def add1(self, op: str, inputs: list[str], **kwargs: Any) -> str:
        """`add` for the common single-output node."""
        return self.add(op, inputs, **kwargs)[0]

    def build(self, outputs: list[str], meta: ModelMeta) -> Graph:
        used = {i for n in self.nodes for i in n.inputs} | set(outputs)
        values = {k: v for k, v in self.values.items() if k in used or k == self.input}
        # Outputs of a split that nobody reads still need their entry: the node defines them.
        for node in self.nodes:
            for out in node.outputs:
                values.setdefault(out, self.values[out])
        graph = Graph(meta, [self.input], list(outputs), values, self.nodes, self.weights)
        graph.validate()
        return graph

    def _unique_name(self, base: str) -> str:
        name, i = base, 1
        while name in self._taken:
            name, i = f"{base}#{i}", i + 1
        self._taken.add(name)
        return name


def batch_shape(channels: int, height: int, width: int) -> Shape:
    return (BATCH, channels, height, width)
