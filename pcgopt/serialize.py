"""PCG <-> JSON. The format is versioned; reading checks every field and says which is wrong.

.. code-block:: json

    {"format": "pcgopt.pcg", "version": 1,
     "nodes": [{"name": "x", "op": "input", "inputs": [], "params": {"shape": [64, 784], ...}},
               {"name": "h", "op": "matmul", "inputs": ["x", "w"], "params": {}}],
     "outputs": ["h"]}

An input reference is ``"node"`` (its output 0) or ``"node:k"``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pcgopt.errors import SchemaError
from pcgopt.graph import PCG, Node, TensorRef

FORMAT = "pcgopt.pcg"
VERSION = 1
_NODE_KEYS = {"name", "op", "inputs", "params"}


def pcg_to_dict(pcg: PCG) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": VERSION,
        "nodes": [
            {
                "name": n.name,
                "op": n.op,
                "inputs": [str(r) for r in n.inputs],
                "params": n.params.to_json(),
            }
            for n in pcg.nodes
        ],
        "outputs": [str(r) for r in pcg.outputs],
    }


def pcg_to_json(pcg: PCG, indent: int | None = 1) -> str:
    """JSON text. With ``indent`` (the default) one node per line, so diffs stay readable."""
    data = pcg_to_dict(pcg)
    if indent is None:
        return json.dumps(data)
    pad = " " * indent
    nodes = f",\n{pad}{pad}".join(json.dumps(n) for n in data["nodes"])
    return (
        f'{{\n{pad}"format": {json.dumps(FORMAT)},\n{pad}"version": {VERSION},\n'
        f'{pad}"nodes": [\n{pad}{pad}{nodes}\n{pad}],\n'
        f'{pad}"outputs": {json.dumps(data["outputs"])}\n}}\n'
    )


def _require(cond: bool, message: str, node: str | None = None) -> None:
    if not cond:
        raise SchemaError(message, node=node)


def pcg_from_dict(data: Mapping[str, Any]) -> PCG:
    _require(
        isinstance(data, Mapping),
        f"a PCG document must be a JSON object, got {type(data).__name__}",
    )
    _require(
        data.get("format") == FORMAT,
        f"not a PCG document: 'format' is {data.get('format')!r}, expected {FORMAT!r}",
    )
    version = data.get("version")
    _require(isinstance(version, int), f"'version' must be an integer, got {version!r}")
    _require(
        version <= VERSION,
        f"this document has format version {version}; this pcgopt reads versions up to {VERSION}",
    )
    nodes_raw = data.get("nodes")
    _require(
        isinstance(nodes_raw, list) and len(nodes_raw) > 0,
        "'nodes' must be a non-empty list of node objects",
    )
    nodes = []
    for i, raw in enumerate(nodes_raw):
        _require(isinstance(raw, Mapping), f"nodes[{i}] must be an object, got {raw!r}")
        name = raw.get("name")
        where = f"nodes[{i}]" + (f" ({name!r})" if isinstance(name, str) else "")
        extra = sorted(set(raw) - _NODE_KEYS)
        _require(
            not extra, f"{where} has unknown field(s) {extra}; valid: {sorted(_NODE_KEYS)}", name
        )
        _require(
            isinstance(name, str) and name != "", f"{where}: 'name' must be a non-empty string"
        )
        _require(isinstance(raw.get("op"), str), f"{where}: 'op' must be a string", name)
        inputs = raw.get("inputs", [])
        _require(
            isinstance(inputs, list) and all(isinstance(r, str) for r in inputs),
            f'{where}: \'inputs\' must be a list of strings such as "node" or "node:1"',
            name,
        )
        params = raw.get("params", {})
        _require(isinstance(params, Mapping), f"{where}: 'params' must be an object", name)
        nodes.append(Node(name, raw["op"], tuple(TensorRef.parse(r) for r in inputs), dict(params)))
    outputs = data.get("outputs")
    _require(
        outputs is None or (isinstance(outputs, list) and all(isinstance(r, str) for r in outputs)),
        "'outputs' must be a list of tensor references",
    )
    _require(
        outputs is None or len(outputs) > 0,
        "'outputs' is empty: a PCG computes at least one output (leave the field out to make "
        "every unread tensor an output)",
    )
    return PCG(nodes, outputs)


def pcg_from_json(text: str) -> PCG:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise SchemaError(f"not valid JSON: {e}") from None
    except RecursionError:
        raise SchemaError("not valid JSON: nested too deeply") from None
    return pcg_from_dict(data)
