"""The operator registry: every operator pcgopt knows, each defined once by its spec.

>>> OPERATORS["matmul"]
<op matmul>
>>> get_op("relu").kind
COMPUTE
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from pcgopt.errors import UnknownOperatorError
from pcgopt.ops.conv import Conv2D, Pool2D
from pcgopt.ops.elementwise import (
    GELU,
    Add,
    Cast,
    Compare,
    Div,
    Dropout,
    Erf,
    Exp,
    GELUExact,
    Log,
    Maximum,
    Mul,
    Neg,
    Pow,
    Reciprocal,
    ReLU,
    Rsqrt,
    Scale,
    Sigmoid,
    Sqrt,
    Sub,
    Tanh,
    Where,
)
from pcgopt.ops.embedding import Embedding, EmbeddingBag
from pcgopt.ops.layout import Broadcast, Concat, Pad, Reshape, Slice, Split, Transpose
from pcgopt.ops.linalg import BatchMatMul, Linear, MatMul
from pcgopt.ops.normalization import BatchNorm, LayerNorm, Softmax
from pcgopt.ops.parallel import (
    AllGather,
    AllReduce,
    AllToAll,
    Batch,
    Combine,
    DiscardCopies,
    ParallelOp,
    Partition,
    Pipeline,
    Reduce,
    ReduceScatter,
    Replicate,
    StackPartial,
    ToPartial,
)
from pcgopt.ops.params import Param, Params, ParamType
from pcgopt.ops.reduction import ReduceMax, ReduceMean, ReduceSum, TopK
from pcgopt.ops.sources import Input, Weight
from pcgopt.ops.spec import (
    AxisKind,
    ComputeOp,
    LocalContext,
    LoopAxis,
    OpKind,
    OpSpec,
    Signature,
    SizeRelation,
)

_SPECS: tuple[OpSpec, ...] = (
    # sources
    Input(),
    Weight(),
    # elementwise
    ReLU(),
    GELU(),
    Sigmoid(),
    Tanh(),
    Dropout(),
    Scale(),
    GELUExact(),
    Erf(),
    Exp(),
    Log(),
    Sqrt(),
    Rsqrt(),
    Reciprocal(),
    Neg(),
    Pow(),
    Add(),
    Sub(),
    Mul(),
    Div(),
    Maximum(),
    Compare(),
    Where(),
    Cast(),
    # products
    MatMul(),
    BatchMatMul(),
    Linear(),
    # vision
    Conv2D(),
    Pool2D(),
    # normalization
    BatchNorm(),
    LayerNorm(),
    Softmax(),
    # layout
    Concat(),
    Split(),
    Slice(),
    Transpose(),
    Reshape(),
    Broadcast(),
    Pad(),
    # lookups
    Embedding(),
    EmbeddingBag(),
    # reductions along axes
    ReduceSum(),
    ReduceMean(),
    ReduceMax(),
    TopK(),
    # parallelization
    Partition(),
    Combine(),
    Replicate(),
    Reduce(),
    DiscardCopies(),
    ToPartial(),
    StackPartial(),
    AllReduce(),
    AllGather(),
    ReduceScatter(),
    AllToAll(),
    Pipeline(),
    Batch(),
)

#: Operator name -> spec. Read-only.
OPERATORS: Mapping[str, OpSpec] = MappingProxyType({s.name: s for s in _SPECS})
assert len(OPERATORS) == len(_SPECS), "duplicate operator name"


def get_op(name: str) -> OpSpec:
    """The spec of operator ``name``; UnknownOperatorError lists the valid names."""
    try:
        return OPERATORS[name]
    except KeyError:
        raise UnknownOperatorError(
            f"unknown operator {name!r}; known operators: {', '.join(sorted(OPERATORS))}"
        ) from None


def ops_of_kind(kind: OpKind) -> tuple[OpSpec, ...]:
    return tuple(s for s in _SPECS if s.kind is kind)


__all__ = [
    "OPERATORS",
    "AxisKind",
    "ComputeOp",
    "LocalContext",
    "LoopAxis",
    "OpKind",
    "OpSpec",
    "ParallelOp",
    "Param",
    "ParamType",
    "Params",
    "Signature",
    "SizeRelation",
    "get_op",
    "ops_of_kind",
]
