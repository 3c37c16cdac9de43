"""pcgopt.egraph: PCGs and verified rules as an egglog e-graph; saturation under budgets; export.

Lives in the top-level folder ``egraph/`` and installs as ``pcgopt.egraph`` (see DESIGN.md).

* :mod:`~pcgopt.egraph.language`: the egglog constructors, derived from the operator registry,
  and the per-e-class fact tables (sizes, degrees, copies, partial sums, dtype, devices);
* :mod:`~pcgopt.egraph.translate`: each verified rule as guarded egglog rewrites (both
  directions), the guard derived from the operator specs;
* :mod:`~pcgopt.egraph.saturate`: :func:`saturate` under a :class:`Budget`;
* :mod:`~pcgopt.egraph.split`: :func:`saturate_split`, a deep model's distinct segments
  saturated once and joined into the whole model's e-graph;
* :mod:`~pcgopt.egraph.export`: the e-graph as plain data (:class:`EGraphData`), and a choice of
  e-nodes back to a PCG.
"""

from pcgopt.egraph.export import ChoiceError, EGraphData, ENode
from pcgopt.egraph.language import EGraphError
from pcgopt.egraph.saturate import (
    Budget,
    IterationStats,
    Saturation,
    ShapeConflictError,
    StopReason,
    saturate,
    saturate_together,
    shipped_presets,
    warm_up,
    warm_up_in_background,
)
from pcgopt.egraph.split import join_segments, saturate_split

__all__ = [
    "Budget",
    "ChoiceError",
    "EGraphData",
    "EGraphError",
    "ENode",
    "IterationStats",
    "Saturation",
    "ShapeConflictError",
    "StopReason",
    "join_segments",
    "saturate",
    "saturate_split",
    "saturate_together",
    "shipped_presets",
    "warm_up",
    "warm_up_in_background",
]
