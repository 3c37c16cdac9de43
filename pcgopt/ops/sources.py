"""Sources: graph inputs and trainable weights. Their values are fed to the evaluator."""

from __future__ import annotations

from pcgopt.errors import EvaluationError, ShapeError
from pcgopt.ops.params import Param, ParamType
from pcgopt.ops.spec import OpKind, OpSpec
from pcgopt.shapes import DType, ParallelTensorShape


class SourceOp(OpSpec):
    kind = OpKind.SOURCE

    def infer(self, params, inputs):
        dtype = params["dtype"]
        return (ParallelTensorShape.of(params["shape"], dtype),)

    def evaluate(self, params, inputs, outputs):
        raise EvaluationError(f"{self.name} nodes are fed values, not evaluated")

    def reference(self, params, *arrays):
        raise EvaluationError(f"{self.name} nodes are fed values, not evaluated")


class Input(SourceOp):
    """A graph input (activations or, with an integer dtype, indices).

    Integer inputs need ``max_value``: random test values are drawn from ``[0, max_value)`` and
    fed values are checked against it.
    """

    name = "input"
    params = (
        Param("shape", ParamType.SHAPE, doc="logical sizes"),
        Param("dtype", ParamType.DTYPE, DType.F32),
        Param("max_value", ParamType.POS_INT, None, doc="exclusive bound of integer values"),
    )

    def infer(self, params, inputs):
        if params["dtype"].is_integer and params["max_value"] is None:
            raise ShapeError(
                f"an integer input ({params['dtype'].value}) needs max_value, the exclusive bound "
                "of its values (for indices: the table size)"
            )
        return super().infer(params, inputs)


class Weight(SourceOp):
    """A model parameter. ``trainable=False`` marks buffers (e.g. BatchNorm running statistics)
    that get no gradient."""

    name = "weight"
    params = (
        Param("shape", ParamType.SHAPE, doc="logical sizes"),
        Param("dtype", ParamType.DTYPE, DType.F32),
        Param("trainable", ParamType.BOOL, True),
    )
