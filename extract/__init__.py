"""pcgopt.extract: the cost model, extraction, the machine-mapping DP, placement and reduction
synthesis, and the optimizer's entry point.

Lives in the top-level folder ``extract/`` and installs as ``pcgopt.extract`` (see DESIGN.md).

* :mod:`pcgopt.extract.cost`: :func:`iteration_cost`, what one training iteration of a PCG
  costs on a :class:`pcgopt.Machine` (compute, communication by level, memory per device), and
  :func:`collective_cost`, the alpha-beta model of one collective on the hierarchy;
* :mod:`pcgopt.extract.calibrate`: :func:`fit_alpha_beta`, alpha and beta fitted to measured
  collective timings (:func:`load_csv`);
* :mod:`pcgopt.extract.baselines`: :func:`data_parallel`, :func:`megatron` and
  :func:`sequential`, the hand-written plans the optimizer must never lose to, and
  :func:`coordinate_descent`, AutoDDL's search (:mod:`pcgopt.extract.layerwise`: per-layer
  SBP matmul strategies, :func:`metropolis_hastings`, :func:`summa_like`);
* :mod:`pcgopt.extract.extraction`: :func:`extract_greedy` and :func:`extract_ilp`, the cheapest
  PCG in an e-graph under the cost model;
* :mod:`pcgopt.extract.mapping`: :func:`map_machine`, Unity's machine-mapping DP: which
  independent branches run at once on disjoint devices (sequence and parallel splits, a memo
  table shared across candidates, :class:`MappingCache`);
* :mod:`pcgopt.extract.branches`: :func:`branch_parallel`, data parallelism narrowed where
  the mapping DP runs branches at once (:func:`lower_degrees`: a batch degree per node);
* :mod:`pcgopt.extract.placement`: P^2's parallelism matrices (:func:`parallelism_matrices`)
  and :func:`place_plan`, a plan's axes placed on the hierarchy;
* :mod:`pcgopt.extract.reduction`: P^2's reduction-program synthesis (:func:`synthesize`),
  simulator (:func:`simulate`) and ranking (:func:`best_reduction`);
  :mod:`pcgopt.lower.reduction` runs programs as JAX collectives (optional extra);
* :mod:`pcgopt.extract.splitting`: graph splitting (Unity section 5.3): :func:`split_search`
  saturates and extracts a deep PCG segment by segment and stitches the cheapest combination;
* :mod:`pcgopt.extract.plan`: :func:`saturate_and_extract`, PCG and machine to :class:`Plan`.
"""

from pcgopt.extract.baselines import (
    BaselineError,
    coordinate_descent,
    data_parallel,
    fuse,
    megatron,
    sequential,
    unity_figure_2b,
)
from pcgopt.extract.branches import BranchParallel, branch_parallel, lower_degrees
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
    accumulate_to_fit,
    collective_cost,
    flat_coefficients,
    iteration_cost,
    roofline_s,
)
from pcgopt.extract.extraction import (
    DagCost,
    ENodeCosts,
    Extraction,
    ExtractionError,
    dag_cost,
    enode_costs,
    extract_greedy,
    extract_ilp,
)
from pcgopt.extract.layerwise import (
    LayerwiseResult,
    MatmulStrategy,
    metropolis_hastings,
    summa_like,
)
from pcgopt.extract.mapping import (
    DeviceBlock,
    MachineMapping,
    MappedUnit,
    MappingCache,
    MappingError,
    map_machine,
)
from pcgopt.extract.placement import (
    ParallelismMatrix,
    PlacementError,
    PlanPlacement,
    parallelism_matrices,
    place_plan,
)
from pcgopt.extract.plan import (
    DEFAULT_MACHINE,
    Plan,
    PlanCheckError,
    SearchStats,
    default_machine,
    machine_from_spec,
    saturate_and_extract,
)
from pcgopt.extract.reduction import (
    ReductionError,
    ReductionProgram,
    best_reduction,
    simulate,
    synthesize,
)
from pcgopt.extract.splitting import SplitSearch, split_search, split_segments

__all__ = [
    "COLLECTIVES",
    "DEFAULT_MACHINE",
    "OPTIMIZERS",
    "AlphaBeta",
    "BaselineError",
    "BranchParallel",
    "CalibrationError",
    "CollectiveCost",
    "CostBreakdown",
    "CostError",
    "DagCost",
    "DeviceBlock",
    "ENodeCosts",
    "Extraction",
    "ExtractionError",
    "LayerwiseResult",
    "MachineMapping",
    "MappedUnit",
    "MappingCache",
    "MappingError",
    "MatmulStrategy",
    "Measurement",
    "MemoryBreakdown",
    "NodeCost",
    "Optimizer",
    "ParallelismMatrix",
    "PlacementError",
    "Plan",
    "PlanCheckError",
    "PlanPlacement",
    "ReductionCost",
    "ReductionError",
    "ReductionProgram",
    "SearchStats",
    "SplitSearch",
    "accumulate_to_fit",
    "best_reduction",
    "branch_parallel",
    "calibrated",
    "collective_cost",
    "coordinate_descent",
    "dag_cost",
    "data_parallel",
    "default_machine",
    "enode_costs",
    "extract_greedy",
    "extract_ilp",
    "fit_alpha_beta",
    "flat_coefficients",
    "fuse",
    "iteration_cost",
    "load_csv",
    "lower_degrees",
    "machine_from_spec",
    "map_machine",
    "megatron",
    "metropolis_hastings",
    "parallelism_matrices",
    "place_plan",
    "roofline_s",
    "saturate_and_extract",
    "sequential",
    "simulate",
    "split_search",
    "split_segments",
    "summa_like",
    "synthesize",
    "unity_figure_2b",
]
