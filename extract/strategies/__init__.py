"""The strategy generators: parallel plans built by rule rather than searched in the e-graph,
each a PCG the search costs, seeds and must never lose to.

* :mod:`pcgopt.extract.strategies.baselines`: data parallelism, FSDP, Megatron, Unity's Figure
  2b, sequential optimization;
* :mod:`pcgopt.extract.strategies.layerwise`: AutoDDL's per-layer SBP matmul strategies,
  coordinate descent and Metropolis-Hastings;
* :mod:`pcgopt.extract.strategies.branches`: data parallelism narrowed where branches run at
  once;
* :mod:`pcgopt.extract.strategies.pipeline`: pipeline stages (cuts, blocks of nodes, a plan per
  stage) chosen by a dynamic program;
* :mod:`pcgopt.extract.strategies.placement`: P^2's parallelism matrices, a plan's axes placed
  on the hierarchy;
* :mod:`pcgopt.extract.strategies.reduction`: P^2's reduction-program synthesis.
"""
