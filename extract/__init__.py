"""pcgopt.extract: the cost model (and, to come, extraction, the machine-mapping DP, placement and
reduction synthesis).

Lives in the top-level folder ``extract/`` and installs as ``pcgopt.extract`` (see DESIGN.md).

* :mod:`pcgopt.extract.cost`: :func:`iteration_cost`, what one training iteration of a PCG
  costs on a :class:`pcgopt.Machine` (compute, communication by level, memory per device), and
  :func:`collective_cost`, the alpha-beta model of one collective on the hierarchy;
* :mod:`pcgopt.extract.calibrate`: :func:`fit_alpha_beta`, alpha and beta fitted to measured
  collective timings (:func:`load_csv`);
* :mod:`pcgopt.extract.baselines`: :func:`data_parallel`, :func:`megatron` and
  :func:`sequential`, the hand-written plans the optimizer must never lose to.
"""

from pcgopt.extract.baselines import (
    BaselineError,
    data_parallel,
    fuse,
    megatron,
    sequential,
)
from pcgopt.extract.calibrate import (
    AlphaBeta,
    CalibrationError,
    Measurement,
    calibrated,
    fit_alpha_beta,
    load_csv,
)
from pcgopt.extract.cost import (
    COLLECTIVES,
    OPTIMIZERS,
    CollectiveCost,
    CostBreakdown,
    CostError,
    MemoryBreakdown,
    NodeCost,
    Optimizer,
    ReductionCost,
    collective_cost,
    flat_coefficients,
    iteration_cost,
    roofline_s,
)

__all__ = [
    "COLLECTIVES",
    "OPTIMIZERS",
    "AlphaBeta",
    "BaselineError",
    "CalibrationError",
    "CollectiveCost",
    "CostBreakdown",
    "CostError",
    "Measurement",
    "MemoryBreakdown",
    "NodeCost",
    "Optimizer",
    "ReductionCost",
    "calibrated",
    "collective_cost",
    "data_parallel",
    "fit_alpha_beta",
    "flat_coefficients",
    "fuse",
    "iteration_cost",
    "load_csv",
    "megatron",
    "roofline_s",
    "sequential",
]
