"""pcgopt.extract: the cost model, the strategy generators and the search, from a saturated
e-graph to the optimizer's entry point.

Lives in the top-level folder ``extract/`` and installs as ``pcgopt.extract`` (see DESIGN.md).
Three parts, one subpackage each; everything public is re-exported here.

The cost model, :mod:`pcgopt.extract.costmodel`:

* :mod:`~pcgopt.extract.costmodel.cost`: :func:`iteration_cost`, what one training iteration
  of a PCG costs on a :class:`pcgopt.Machine` (compute, communication by level, memory per
  device), and :func:`collective_cost`, the alpha-beta model of one collective on the
  hierarchy;
* :mod:`~pcgopt.extract.costmodel.simulate`: one training iteration simulated task by task under
  a :class:`Runtime` (collectives beside computation, gradients in buckets: PyTorch DDP's
  :data:`DDP` by default; :data:`ADDITIVE` adds everything up), its :class:`Timeline`;
* :mod:`~pcgopt.extract.costmodel.calibrate`: :func:`fit_alpha_beta`, alpha and beta fitted
  to measured collective timings (:func:`load_csv`);
* :mod:`~pcgopt.extract.costmodel.pipeline`: a pipeline's iteration under the 1F1B schedule
  (:func:`schedule_1f1b`, :func:`pipeline_time`) or PipeDream-2BW's, from its stages'
  :class:`StageTimes`.

The strategy generators, :mod:`pcgopt.extract.strategies`:

* :mod:`~pcgopt.extract.strategies.baselines`: :func:`data_parallel`, :func:`fsdp`,
  :func:`megatron` and :func:`sequential`, the hand-written plans the optimizer must never lose to;
* :mod:`~pcgopt.extract.strategies.layerwise`: AutoDDL's per-layer SBP matmul strategies,
  :func:`coordinate_descent`, :func:`metropolis_hastings`, :func:`summa_like`;
* :mod:`~pcgopt.extract.strategies.branches`: :func:`branch_parallel`, data parallelism
  narrowed where the mapping DP runs branches at once (:func:`lower_degrees`: a batch degree
  per node);
* :mod:`~pcgopt.extract.strategies.pipeline`: :func:`pipeline_search`, the model cut into
  pipeline stages on blocks of nodes, each with a plan of its own (:class:`PipelinePlan`);
* :mod:`~pcgopt.extract.strategies.placement`: P^2's parallelism matrices
  (:func:`parallelism_matrices`) and :func:`place_plan`, a plan's axes placed on the
  hierarchy;
* :mod:`~pcgopt.extract.strategies.reduction`: P^2's reduction-program synthesis
  (:func:`synthesize`), simulator (:func:`simulate`) and ranking (:func:`best_reduction`);
  :mod:`pcgopt.lower.reduction` runs programs as JAX collectives (optional extra).

The search, :mod:`pcgopt.extract.search`:

* :mod:`~pcgopt.extract.search.extraction`: :func:`extract_greedy` and :func:`extract_ilp`,
  the cheapest PCG in an e-graph under the cost model;
* :mod:`~pcgopt.extract.search.mapping`: :func:`map_machine`, Unity's machine-mapping DP:
  which independent branches run at once on disjoint devices (a memo table shared across
  candidates, :class:`MappingCache`);
* :mod:`~pcgopt.extract.search.splitting`: graph splitting (Unity section 5.3):
  :func:`split_search` saturates and extracts a deep PCG segment by segment and stitches the
  cheapest combination;
* :mod:`~pcgopt.extract.search.plan`: :func:`saturate_and_extract`, PCG and machine to
  :class:`Plan`.
"""

from pcgopt.extract.costmodel.calibrate import (
    AlphaBeta,
    CalibrationError,
    Measurement,
    calibrated,
    fit_alpha_beta,
    load_csv,
)
from pcgopt.extract.costmodel.cost import (
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
from pcgopt.extract.costmodel.pipeline import (
    PipelineError,
    StageTimes,
    pipeline_time,
    schedule_1f1b,
)
from pcgopt.extract.costmodel.simulate import ADDITIVE, DDP, Runtime, Task, Timeline
from pcgopt.extract.search.extraction import (
    DagCost,
    ENodeCosts,
    Extraction,
    ExtractionError,
    dag_cost,
    enode_costs,
    extract_greedy,
    extract_ilp,
)
from pcgopt.extract.search.mapping import (
    DeviceBlock,
    MachineMapping,
    MappedUnit,
    MappingCache,
    MappingError,
    map_machine,
)
from pcgopt.extract.search.plan import (
    DEFAULT_MACHINE,
    Plan,
    PlanCheckError,
    SearchStats,
    default_machine,
    machine_from_spec,
    saturate_and_extract,
)
from pcgopt.extract.search.splitting import SplitSearch, split_search, split_segments
from pcgopt.extract.strategies.baselines import (
    BaselineError,
    coordinate_descent,
    data_parallel,
    fsdp,
    fuse,
    megatron,
    sequential,
    unity_figure_2b,
)
from pcgopt.extract.strategies.branches import BranchParallel, branch_parallel, lower_degrees
from pcgopt.extract.strategies.layerwise import (
    LayerwiseResult,
    MatmulStrategy,
    metropolis_hastings,
    summa_like,
)
from pcgopt.extract.strategies.pipeline import PipelinePlan, Stage, pipeline_search
from pcgopt.extract.strategies.placement import (
    ParallelismMatrix,
    PlacementError,
    PlanPlacement,
    parallelism_matrices,
    place_plan,
)
from pcgopt.extract.strategies.reduction import (
    ReductionError,
    ReductionProgram,
    best_reduction,
    simulate,
    synthesize,
)

__all__ = [
    "ADDITIVE",
    "COLLECTIVES",
    "DDP",
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
    "PipelineError",
    "PipelinePlan",
    "PlacementError",
    "Plan",
    "PlanCheckError",
    "PlanPlacement",
    "ReductionCost",
    "ReductionError",
    "ReductionProgram",
    "Runtime",
    "SearchStats",
    "SplitSearch",
    "Stage",
    "StageTimes",
    "Task",
    "Timeline",
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
    "fsdp",
    "fuse",
    "iteration_cost",
    "load_csv",
    "lower_degrees",
    "machine_from_spec",
    "map_machine",
    "megatron",
    "metropolis_hastings",
    "parallelism_matrices",
    "pipeline_search",
    "pipeline_time",
    "place_plan",
    "roofline_s",
    "saturate_and_extract",
    "schedule_1f1b",
    "sequential",
    "simulate",
    "split_search",
    "split_segments",
    "summa_like",
    "synthesize",
    "unity_figure_2b",
]
