"""Typed errors. Every error about a graph names the node (and tensor or field) at fault.

All derive from :class:`PCGError`, itself a ``ValueError``, so callers can catch one type.
An operator's shape inference raises these without a node; the graph validator re-raises
them with the node's name and operator in front (see :meth:`PCGError.at_node`).
"""

from __future__ import annotations


class PCGError(ValueError):
    """Base class: something about a PCG (or its input) is invalid.

    ``node`` is the name of the node at fault when known.
    """

    def __init__(self, message: str, *, node: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.node = node

    def at_node(self, node: str, op: str) -> PCGError:
        """The same error, located at ``node`` (an ``op`` node), keeping its type."""
        if self.node is not None:
            return self
        err = type(self)(f"node {node!r} ({op}): {self.message}", node=node)
        err.__cause__ = self.__cause__
        return err


class UnknownOperatorError(PCGError):
    """A node names an operator that does not exist."""


class ArityError(PCGError):
    """A node has the wrong number of inputs for its operator."""


class ParameterError(PCGError):
    """A node's parameter is missing, unknown, of the wrong type, or out of range."""


class ShapeError(PCGError):
    """Input shapes do not fit the operator (sizes, ranks or dtypes)."""


class DegreeError(ShapeError):
    """A parallel degree is illegal: it does not divide a size, a split dimension cannot be split
    by this operator, or replicas are of the wrong kind or number."""


class CycleError(PCGError):
    """The graph has a cycle."""


class DanglingEdgeError(PCGError):
    """An edge refers to a node or output that does not exist."""


class DuplicateNameError(PCGError):
    """Two nodes have the same name."""


class SchemaError(PCGError):
    """A serialized PCG does not follow the format (missing field, wrong version, bad type)."""


class EvaluationError(PCGError):
    """The reference evaluator was given inputs that do not fit the graph."""


class FrontendError(PCGError):
    """A model from another framework (ONNX, JAX) cannot be imported as it is.

    ``unsupported`` maps each operator or primitive pcgopt cannot import to how many times it
    occurs and the names of its first occurrences, so one error lists everything at fault.
    """

    def __init__(
        self,
        message: str,
        *,
        node: str | None = None,
        unsupported: dict[str, tuple[int, tuple[str, ...]]] | None = None,
    ) -> None:
        super().__init__(message, node=node)
        self.unsupported = dict(unsupported or {})


class NotEquivalentError(AssertionError):
    """Two PCGs were required to be equivalent and are not; the message says where they differ."""
