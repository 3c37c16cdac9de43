"""The search: from a saturated e-graph to a placed, mapped, checked plan.

* :mod:`pcgopt.extract.search.extraction`: the cheapest PCG in an e-graph (greedy and exact);
* :mod:`pcgopt.extract.search.mapping`: Unity's machine-mapping DP (branches at once on
  disjoint devices);
* :mod:`pcgopt.extract.search.splitting`: graph splitting, segment by segment;
* :mod:`pcgopt.extract.search.plan`: :func:`~pcgopt.extract.search.plan.saturate_and_extract`,
  the library call, and its :class:`~pcgopt.extract.search.plan.Plan`.
"""
