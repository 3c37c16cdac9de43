"""pcgopt: joint algebraic and parallelization optimization of DNN training graphs.

``pcgopt.saturate_and_extract(pcg, machine)`` is the optimizer (:mod:`pcgopt.extract.search.plan`).

A model is a parallel computation graph (:class:`PCG`): operators plus parallelization
operators (Partition, Combine, Replicate, Reduce and fused collectives) on parallel tensors
(:class:`ParallelTensorShape`). :func:`evaluate` is its meaning; :func:`equivalent` checks that
two PCGs compute the same thing.
"""

from pcgopt.builder import PCGBuilder, Tensor
from pcgopt.errors import (
    ArityError,
    CycleError,
    DanglingEdgeError,
    DegreeError,
    DuplicateNameError,
    EvaluationError,
    FrontendError,
    NotEquivalentError,
    ParameterError,
    PCGError,
    SchemaError,
    ShapeError,
    UnknownOperatorError,
)
from pcgopt.evaluate import Evaluation, assert_equivalent, equivalent, evaluate, random_feeds
from pcgopt.graph import PCG, Node, TensorRef
from pcgopt.machine import DeviceSpec, Level, Link, Machine, MachineError
from pcgopt.micro import with_micro_batches
from pcgopt.ops import OPERATORS, OpKind, OpSpec, get_op
from pcgopt.scaled import ScaledDown, ScaleDownError, scaled_down
from pcgopt.shapes import DType, ParallelDim, ParallelTensorShape
from pcgopt.sharded import ShardedArray

__version__ = "0.1.0"

__all__ = [
    "OPERATORS",
    "PCG",
    "ArityError",
    "CycleError",
    "DType",
    "DanglingEdgeError",
    "DegreeError",
    "DeviceSpec",
    "DuplicateNameError",
    "Evaluation",
    "EvaluationError",
    "FrontendError",
    "Level",
    "Link",
    "Machine",
    "MachineError",
    "Node",
    "NotEquivalentError",
    "OpKind",
    "OpSpec",
    "PCGBuilder",
    "PCGError",
    "ParallelDim",
    "ParallelTensorShape",
    "ParameterError",
    "Plan",
    "ScaleDownError",
    "ScaledDown",
    "SchemaError",
    "ShapeError",
    "ShardedArray",
    "Tensor",
    "TensorRef",
    "UnknownOperatorError",
    "assert_equivalent",
    "equivalent",
    "evaluate",
    "get_op",
    "random_feeds",
    "saturate_and_extract",
    "scaled_down",
    "with_micro_batches",
]

# The optimizer lives in the top layer (pcgopt.extract); the IR package must not import it at
# load time (data flows one way), so the entry point is resolved on first use.
_TOP_LEVEL = {"saturate_and_extract", "Plan"}


def __getattr__(name: str):
    if name in _TOP_LEVEL:
        from pcgopt.extract.search import plan

        return getattr(plan, name)
    raise AttributeError(f"module 'pcgopt' has no attribute {name!r}")
