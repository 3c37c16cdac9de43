"""A builder for PCGs: one method per operator, derived from the operator registry.

>>> b = PCGBuilder()
>>> x = b.input((64, 784), name="x")
>>> h = b.relu(b.matmul(x, b.weight((784, 512), name="w1")))
>>> h
Tensor(relu_1: f32[64, 512])
>>> b.partition(h, dim=0, degree=2).shape
f32[64/2, 512]

Every operator ``op`` is ``b.op(*inputs, name=None, **params)``; ``b.input`` and ``b.weight``
take a shape instead of inputs. Shapes are checked as each node is added, so a mistake is
reported at the line that makes it.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pcgopt.errors import DuplicateNameError, PCGError
from pcgopt.graph import PCG, Node, TensorRef
from pcgopt.ops import OPERATORS, OpKind, OpSpec, get_op
from pcgopt.ops.params import Params
from pcgopt.shapes import DType, ParallelTensorShape


@dataclass(frozen=True, slots=True)
class Tensor:
    """A tensor made by a builder: a reference plus its parallel shape."""

    ref: TensorRef
    shape: ParallelTensorShape

    def __repr__(self) -> str:
        return f"Tensor({self.ref}: {self.shape})"


class PCGBuilder:
    """Builds a :class:`~pcgopt.graph.PCG` node by node (see the module docstring)."""

    def __init__(self) -> None:
        self._nodes: list[Node] = []
        self._shapes: dict[str, tuple[ParallelTensorShape, ...]] = {}
        self._counts: Counter[str] = Counter()
        self._scopes: list[str] = []

    # -- sources ------------------------------------------------------------------------------

    def input(
        self,
        shape: Sequence[int],
        dtype: DType | str = DType.F32,
        *,
        name: str | None = None,
        max_value: int | None = None,
    ) -> Tensor:
        """A graph input. Integer inputs (indices) need ``max_value``, their exclusive bound."""
        return self.apply("input", name=name, shape=tuple(shape), dtype=dtype, max_value=max_value)  # type: ignore[return-value]

    def weight(
        self,
        shape: Sequence[int],
        dtype: DType | str = DType.F32,
        *,
        name: str | None = None,
        trainable: bool = True,
    ) -> Tensor:
        """A model parameter (``trainable=False``: a buffer such as running statistics)."""
        return self.apply("weight", name=name, shape=tuple(shape), dtype=dtype, trainable=trainable)  # type: ignore[return-value]

    # -- any operator -------------------------------------------------------------------------

    def apply(
        self, op: str, *inputs: Tensor, name: str | None = None, **params: Any
    ) -> Tensor | tuple[Tensor, ...]:
        """Adds an ``op`` node; returns its output (a tuple when it has several)."""
        spec = get_op(op)
        name = self._name(name, op)
        for i, t in enumerate(inputs):
            if not isinstance(t, Tensor) or t.ref.node not in self._shapes:
                raise PCGError(
                    f"node {name!r} ({op}): input {i} is {t!r}, not a tensor of this builder",
                    node=name,
                )
        try:
            spec.check_arity(len(inputs))
            in_shapes = tuple(t.shape for t in inputs)
            canonical, out_shapes = _inferred(spec, params, in_shapes)
        except PCGError as e:
            raise e.at_node(name, op) from None
        self._nodes.append(Node(name, op, tuple(t.ref for t in inputs), canonical))
        self._shapes[name] = out_shapes
        outs = tuple(Tensor(TensorRef(name, i), s) for i, s in enumerate(out_shapes))
        return outs[0] if len(outs) == 1 else outs

    def __getattr__(self, op: str) -> Callable[..., Any]:
        if op.startswith("_") or op not in OPERATORS:
            raise AttributeError(f"PCGBuilder has no attribute or operator {op!r}")

        def add_node(*inputs: Tensor, name: str | None = None, **params: Any):
            return self.apply(op, *inputs, name=name, **params)

        add_node.__name__ = op
        add_node.__doc__ = OPERATORS[op].doc
        return add_node

    def __dir__(self) -> list[str]:
        ops = [n for n, s in OPERATORS.items() if s.kind is not OpKind.SOURCE]
        return sorted(set(super().__dir__()) | set(ops))

    # -- naming -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def scope(self, prefix: str) -> Iterator[None]:
        """Names made inside get ``prefix/`` in front (scopes nest), e.g. ``layer3/matmul_2``."""
        self._scopes.append(prefix)
        try:
            yield
        finally:
            self._scopes.pop()

    def _name(self, name: str | None, op: str) -> str:
        prefix = "".join(f"{s}/" for s in self._scopes)
        if name is None:
            while True:
                self._counts[op] += 1
                name = f"{prefix}{op}_{self._counts[op]}"
                if name not in self._shapes:
                    break
        else:
            name = prefix + name
        if name in self._shapes:
            raise DuplicateNameError(f"a node named {name!r} already exists", node=name)
        return name

    # -- result -------------------------------------------------------------------------------

    @property
    def nodes(self) -> tuple[Node, ...]:
        return tuple(self._nodes)

    def build(self, *outputs: Tensor | Sequence[Tensor]) -> PCG:
        """The PCG with the given outputs (default: every tensor nothing reads)."""
        flat: list[Tensor] = []
        for o in outputs:
            flat.extend(o if isinstance(o, list | tuple) else [o])
        # Every node was validated as it was added: no need to run the shape rules again.
        return PCG._checked(
            tuple(self._nodes), self._shapes, [t.ref for t in flat] if flat else None
        )


#: Shape inference's results by operator, parameters (with their types: 1 and True, or 4 and
#: 4.0, are different parameters) and input shapes. Specs are pure, and the searches build the
#: same nodes over and over (every layer of a model, in every candidate plan): the layer-wise
#: search's evaluations of BERT-Large on 64 GPUs spent a third of their time inferring shapes.
_INFERRED: dict[Hashable, tuple[Params, tuple[ParallelTensorShape, ...]]] = {}
_INFERRED_MAX = 1 << 14


def _typed(value: Any) -> Hashable:
    if isinstance(value, tuple | list):
        return (type(value), tuple(_typed(v) for v in value))
    if isinstance(value, float):  # -0.0 == 0.0, yet a factor's sign is the sign of a product
        return (float, value.hex())
    return (type(value), value)


def _inferred(
    spec: OpSpec, params: dict[str, Any], in_shapes: tuple[ParallelTensorShape, ...]
) -> tuple[Params, tuple[ParallelTensorShape, ...]]:
    """``spec``'s canonical parameters and output shapes for these inputs (cached)."""
    try:
        key: Hashable | None = (
            spec.name,
            tuple((k, _typed(v)) for k, v in params.items()),
            in_shapes,
        )
        found = _INFERRED.get(key)
    except TypeError:  # a parameter that is no key (an array)
        key, found = None, None
    if found is None:
        canonical = spec.make_params(params, in_shapes)
        found = (canonical, spec.infer(canonical, in_shapes))
        if key is not None:
            if len(_INFERRED) >= _INFERRED_MAX:
                _INFERRED.clear()
            _INFERRED[key] = found
    return found
