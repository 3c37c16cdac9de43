"""The cost model: what one training iteration of a placed PCG costs on a machine.

* :mod:`pcgopt.extract.costmodel.cost`: :func:`~pcgopt.extract.costmodel.cost.iteration_cost`
  (compute, communication by level, memory per device) and the alpha-beta model of one
  collective on the hierarchy (``collective_cost``);
* :mod:`pcgopt.extract.costmodel.simulate`: one iteration simulated task by task (collectives
  beside computation, gradients in buckets), what ``iteration_cost`` returns as its time;
* :mod:`pcgopt.extract.costmodel.calibrate`: alpha and beta fitted to measured collective
  timings;
* :mod:`pcgopt.extract.costmodel.pipeline`: a pipeline's iteration under the 1F1B or 2BW
  schedule.
"""
