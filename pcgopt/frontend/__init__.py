"""Importers: models written for other frameworks become PCGs.

- :func:`pcgopt.frontend.onnx.from_onnx`: an ONNX graph (from ``torch.onnx.export`` or any other
  exporter, opset 17 and later).
- :func:`pcgopt.frontend.jax.from_jax`: a JAX function, traced with ``jax.make_jaxpr``.

Both return an :class:`ImportedModel`; both keep the source's names (ONNX node and initializer
names, which PyTorch's exporter builds from module paths; JAX parameter paths) and both raise
one :class:`~pcgopt.FrontendError` that lists every unsupported operator, never a partial
graph. Patterns that are one pcgopt operator (a matrix product plus bias is ``linear``; GELU
written out with erf or tanh is ``gelu_erf`` or ``gelu``) are recognized by
:func:`pcgopt.frontend.patterns.fuse_patterns`.

The ONNX importer needs the ``onnx`` extra (``pip install 'pcgopt[onnx]'``); the JAX importer
the ``jax`` extra.
"""

from __future__ import annotations

from pcgopt.frontend.model import ImportedModel, load_model

__all__ = ["ImportedModel", "load_model"]
