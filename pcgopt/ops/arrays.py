"""The array namespace an operator's arithmetic runs on: numpy or JAX.

Each operator's semantics is written once (:mod:`pcgopt.ops`), against the namespace of its
arguments: the reference evaluator calls it with numpy arrays, the JAX lowering
(:mod:`pcgopt.lower`) with JAX arrays and tracers inside ``jax.shard_map``, where a block's
position is a traced value (it comes from ``lax.axis_index``). Importing this module never
imports JAX; :func:`array_module` only looks at what it is given.

>>> import numpy as np
>>> array_module(np.ones(2), None) is np
True
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

__all__ = ["array_module", "is_concrete"]


def _is_jax(value: object) -> bool:
    # JAX arrays and tracers live in jax.* / jaxlib.* modules; checking the module name keeps
    # numpy-only callers from importing JAX.
    return type(value).__module__.startswith(("jax", "jaxlib"))


def array_module(*arrays: Any) -> ModuleType:
    """``jax.numpy`` if any argument is a JAX array or tracer, else ``numpy`` (None and Python
    numbers are ignored)."""
    for a in arrays:
        if a is not None and _is_jax(a):
            import jax.numpy as jnp

            return jnp
    return np


def is_concrete(*values: Any) -> bool:
    """Whether every value is a plain number or numpy array (not a JAX array or tracer), so
    that Python code may branch on it."""
    return not any(v is not None and _is_jax(v) for v in values)
