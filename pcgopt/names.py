"""The model's names in a plan: a plan node that computes what a node of the input computes
takes that node's name.

Searches build new graphs (the e-graph's extraction, graph splitting's stitching, the
baselines) and name what they make after its operator (``split3/linear_40``). A user reads a
plan in their model's terms, so :func:`restore_names` maps each plan node back. Both graphs'
tensors get a canonical key of the logical value they hold: parallel operators move a value
and do not change it; a dense layer (``linear``) is its product, plus its bias, then its
activation, so that rewrites that fuse or unfuse it keep the key; the inputs of an addition or a
product are unordered. Then a plan node

- whose operator and value are a model node's takes that node's name;
- that computes a model node's value, or part of it, in another form takes the name of the node
  it replaces and its operator: ``layer0/out/linear.matmul`` and ``layer0/out/linear.add`` for
  a dense layer a rewrite unfused;
- that fuses several model nodes takes their names joined: ``fc1/matmul+relu``.

When several plan nodes compute one value (pieces of a split layer), the first gets the name and
the others ``name~1``, ``name~2``, ... A node whose value the model does not hold keeps its own
name.

>>> from pcgopt import PCGBuilder
>>> b = PCGBuilder()
>>> x = b.input((8, 4), name="x")
>>> model = b.build(b.relu(x, name="layer1/act"))
>>> b = PCGBuilder()
>>> x = b.input((8, 4), name="x")
>>> plan = b.build(b.combine(b.relu(b.partition(x, dim=0, degree=2)), dim=0, degree=2))
>>> [n.name for n in restore_names(model, plan).nodes]
['x', 'x.partition', 'layer1/act', 'layer1/act.combine']
"""

from __future__ import annotations

from pcgopt.graph import PCG, Node, TensorRef
from pcgopt.ops import OpKind
from pcgopt.ops.params import Params

__all__ = ["model_names", "restore_names"]


def restore_names(source: PCG, plan: PCG) -> PCG:
    """``plan`` with its nodes named after the ``source`` nodes they compute (module doc)."""
    names = model_names(source, plan)
    return plan if all(k == v for k, v in names.items()) else plan.renamed(names)


_COMMUTATIVE = frozenset({"add", "mul", "maximum"})


class _Keys:
    """Canonical keys of logical values, interned as ints."""

    def __init__(self) -> None:
        self.table: dict[tuple, int] = {}

    def key(self, op: str, params: object, args: tuple[int, ...], output: int = 0) -> int:
        if op in _COMMUTATIVE:
            args = tuple(sorted(args))
        return self.table.setdefault((op, params, args, output), len(self.table))

    def steps(self, pcg: PCG, node: Node, args: tuple[int, ...]) -> list[tuple[str, int]]:
        """The (operator, key) of each step ``node`` computes; the last is its output's."""
        if node.op != "linear":
            outputs = len(pcg.output_shapes(node.name))
            if outputs > 1:
                return [(node.op, self.key(node.op, node.params, args, k)) for k in range(outputs)]
            return [(node.op, self.key(node.op, node.params, args))]
        steps = [("matmul", self.key("matmul", _NO_PARAMS, args[:2]))]
        if len(args) == 3:
            steps.append(("add", self.key("add", _NO_PARAMS, (steps[-1][1], args[2]))))
        act = node.params["activation"]
        if act != "none":
            steps.append((act, self.key(act, _NO_PARAMS, (steps[-1][1],))))
        return steps


_NO_PARAMS = Params()


def _values(pcg: PCG, keys: _Keys, sources: dict[str, int]) -> dict[str, list[tuple[str, int]]]:
    """Each compute node's steps (:meth:`_Keys.steps`) over the values its inputs hold; nodes
    that read a value the model does not have are left out."""
    value: dict[TensorRef, int] = {}
    out: dict[str, list[tuple[str, int]]] = {}
    for n in pcg.nodes:
        kind = n.spec.kind
        if kind is OpKind.SOURCE:
            if n.name in sources:
                value[n.output()] = sources[n.name]
            continue
        args = tuple(value.get(r) for r in n.inputs)
        if kind is OpKind.PARALLEL:
            if len(args) == 1 and args[0] is not None:
                for k in range(len(pcg.output_shapes(n.name))):
                    value[n.output(k)] = args[0]
            continue
        if any(a is None for a in args):
            continue
        steps = keys.steps(pcg, n, args)  # type: ignore[arg-type]
        out[n.name] = steps
        if len(pcg.output_shapes(n.name)) > 1:
            for k, (_, key) in enumerate(steps):
                value[n.output(k)] = key
        else:
            value[n.output()] = steps[-1][1]
    return out


def _joined(names: list[str]) -> str:
    """``fc1/matmul`` and ``fc1/relu`` as ``fc1/matmul+relu``."""
    parts = [n.split("/") for n in names]
    shared = 0
    while all(len(p) > shared + 1 and p[shared] == parts[0][shared] for p in parts):
        shared += 1
    prefix = "/".join(parts[0][:shared])
    rest = "+".join("/".join(p[shared:]) for p in parts)
    return f"{prefix}/{rest}" if prefix else rest


def model_names(source: PCG, plan: PCG) -> dict[str, str]:
    """The new name of every node of ``plan`` (module docstring); a node that computes no value
    of ``source`` keeps its own."""
    keys = _Keys()
    sources = {n.name: keys.key("source", n.name, ()) for n in source.nodes if not n.inputs}
    # Each key of the model: the node whose value (last step) or part of it it is.
    whole: dict[int, Node] = {}
    part: dict[int, Node] = {}
    for name, steps in _values(source, keys, sources).items():
        node = source.node(name)
        # A node of several outputs has a step per output; a dense layer's last step is its
        # output, the others are parts of it.
        outputs = len(source.output_shapes(name))
        for k, (_, key) in enumerate(steps):
            (whole if outputs > 1 or k == len(steps) - 1 else part).setdefault(key, node)
    wanted: dict[str, str] = {}
    for name, steps in _values(plan, keys, sources).items():
        node = plan.node(name)
        final = steps[-1][1] if len(plan.output_shapes(name)) == 1 else steps[0][1]
        same = whole.get(final)
        if same is not None and same.op == node.op:
            wanted[name] = same.name
            continue
        covered = list(
            dict.fromkeys(
                m.name for _, key in steps for m in (whole.get(key), part.get(key)) if m is not None
            )
        )
        if len(covered) == 1:
            wanted[name] = f"{covered[0]}.{node.op}"
        elif covered:
            wanted[name] = _joined(covered)
    # A parallel operator the search named by its operator takes the name of the value it
    # moves: layer0/ffn1/w.replicate, layer0/res1.all_reduce.
    holder: dict[TensorRef, str] = {}
    for n in plan.nodes:
        if n.spec.kind is OpKind.PARALLEL and n.inputs and n.inputs[0] in holder:
            moved = holder[n.inputs[0]]
            if not n.name.startswith(moved):
                wanted[n.name] = f"{moved}.{n.op}"
        name = wanted.get(n.name, n.name)
        if n.spec.kind is OpKind.PARALLEL and n.inputs and n.inputs[0] in holder:
            name = holder[n.inputs[0]]
        elif n.spec.kind is not OpKind.SOURCE and n.name not in wanted:
            continue
        for k in range(len(plan.output_shapes(n.name))):
            holder[n.output(k)] = name
    taken = {n.name for n in plan.nodes if n.name not in wanted}
    names: dict[str, str] = {}
    for n in plan.nodes:
        if n.name not in wanted:
            names[n.name] = n.name
            continue
        base, k = wanted[n.name], 0
        new = base
        while new in taken:
            k += 1
            new = f"{base}~{k}"
        taken.add(new)
        names[n.name] = new
    return names
