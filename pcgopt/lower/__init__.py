"""A plan lowered to a real engine.

* :mod:`pcgopt.lower.layout`: every tensor of a plan laid out on a device mesh (no JAX needed);
* :mod:`pcgopt.lower.jax`: the plan as a JAX ``shard_map`` program that runs a training step on
  N devices, its compiled collectives, and the plan as ``NamedSharding``s (``pip install
  'pcgopt[jax]'``);
* :mod:`pcgopt.lower.placement`: the mesh's device order that runs every collective on the
  plan's device groups (no JAX needed);
* :mod:`pcgopt.lower.mapped`: plans whose branches run at once on disjoint devices, as one
  program per block of devices;
* :mod:`pcgopt.lower.reduction`: P^2's synthesized reduction programs run as JAX collectives.
"""

from pcgopt.lower.layout import (
    DeviceGrid,
    LayoutAssignment,
    LayoutError,
    MeshLayout,
    assign_layouts,
)

__all__ = ["DeviceGrid", "LayoutAssignment", "LayoutError", "MeshLayout", "assign_layouts"]
