"""Pipelined plans run on their stages' devices: one program per stage on a sub-mesh of its
block, micro-batches passed from stage to stage.

A :class:`~pcgopt.extract.strategies.pipeline.PipelinePlan` cuts the model into stages, each a
PCG of its own (its entry an input, its exit an output) planned for a block of devices.
:func:`lower_pipeline` runs it as :mod:`pcgopt.lower.mapped` runs branches on blocks:

* **Stages.** Each stage's plan, on one micro-batch (:func:`pcgopt.scaled.micro_batched`), is
  lowered by :func:`~pcgopt.lower.jax.lower` to a ``shard_map`` program on a mesh of its block's
  devices, its collectives on the cost model's groups (consecutive devices of the block). The
  tensor a stage hands on goes to the next stage's mesh (``jax.device_put``: the transfer),
  and its gradient comes back the same way.
* **1F1B.** A training step runs every micro-batch through the stages, forward then backward
  (each stage's compiled ``jax.vjp``), and adds up the gradients; the loss and gradients of the
  step are their mean over the micro-batches (the model's loss is a mean over its samples; the
  search refuses models whose operators mix samples). The forwards and backwards are issued in
  1F1B order (:func:`~pcgopt.extract.costmodel.pipeline.one_f_one_b_order`: each stage its
  warm-up forwards, then one forward and one backward in turn). JAX dispatches asynchronously,
  so each stage's devices run its operations in that order while the other stages run theirs,
  and the optimizer's update waits for the last backward (the flush). A weight two stages read
  (a tied embedding) gets the sum of both stages' gradients, and is updated on the devices of
  the first stage that reads it. 2BW's delayed update is not run: a plan of that schedule is
  refused.

The check of such a program is the same as for any plan: its loss and gradients against the
unsharded model's over the same micro-batches (:func:`~pcgopt.lower.jax.reference_loss_and_grads`
with ``micro_batches``), and a training step against the optimizer's step on them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pcgopt.extract.costmodel.pipeline import one_f_one_b_order
from pcgopt.graph import PCG, TensorRef
from pcgopt.lower.jax import (
    DEFAULT_LEARNING_RATE,
    LoweringError,
    _available,
    _data_inputs,
    jnp,
    lower,
)
from pcgopt.lower.mapped import MappedLowered, Piece
from pcgopt.ops import OpKind
from pcgopt.scaled import joined_micro_batches, micro_batched

__all__ = ["PipelinedLowered", "lower_pipeline"]


@dataclass(eq=False)
class PipelinedLowered(MappedLowered):
    """A pipelined plan as programs on its stages' sub-meshes, run micro-batch by micro-batch
    (module docstring). The same calls as :class:`~pcgopt.lower.mapped.MappedLowered`, on
    whole batches: ``loss_and_grads``, ``init``, ``train_step``, ``forward`` (outputs with the
    batch in dimension 0 joined along it, others averaged over the micro-batches)."""

    stages: int = 1

    def __repr__(self) -> str:
        return (
            f"PipelinedLowered({self.stages} stages on {len(self.devices)} devices, "
            f"{self.micro_batches} micro-batches; {self.optimizer})"
        )

    def _run(self, feeds: Mapping[str, Any], *, backward: bool) -> tuple[Any, dict, dict]:
        m = self.micro_batches
        data = _data_inputs(self.pcg)
        chunks = []
        for i in range(m):
            chunk = {}
            for name, value in feeds.items():
                if name in data:
                    size = np.shape(value)[0] // m
                    value = value[i * size : (i + 1) * size]
                chunk[name] = value
            chunks.append(chunk)
        values: list[dict] = [{} for _ in range(m)]
        tapes: dict[tuple[int, int], Any] = {}
        losses: list[Any] = [None] * m
        cotangents: list[dict] = [{} for _ in range(m)]
        grads: dict[str, Any] = {}
        last = len(self.pieces) - 1
        # Issued in 1F1B order (JAX dispatches asynchronously: each stage's devices run their
        # operations in the order issued, and stages on other devices run beside them).
        order = (
            one_f_one_b_order(len(self.pieces), m)
            if backward
            else tuple((s, "F", i) for i in range(m) for s in range(len(self.pieces)))
        )
        for s, kind, i in order:
            piece = self.pieces[s]
            if kind == "F":
                tapes[s, i] = self._forward_piece(piece, chunks[i], values[i])
                if s == last:
                    losses[i], cotangents[i], seeded = self._loss(
                        chunks[i], values[i], backward=backward
                    )
                    for name, g in seeded.items():
                        grads[name] = grads[name] + g if name in grads else g
            else:
                self._backward_piece(piece, tapes.pop((s, i)), values[i], cotangents[i], grads)
        joined: dict[TensorRef, Any] = {}
        for model_ref in self.pcg.outputs:
            r = self.aliases.get(model_ref, model_ref)
            sizes = self.pcg.shape(model_ref).sizes
            joined[r] = joined_micro_batches([v[r] for v in values], sizes[:1], jnp)
        return sum(losses) / m, joined, {k: g / m for k, g in grads.items()}


def _check_model(pipeline: Any) -> None:
    """Every input and weight of a stage (but the tensor handed on) must be the model's, of its
    sizes: the model is the one the stages cut."""
    model: PCG = pipeline.model
    for stage in pipeline.stages:
        for node in stage.plan.nodes:
            if node.spec.kind is not OpKind.SOURCE or node.name == stage.entry:
                continue
            mine = stage.plan.shape(node.name).sizes
            theirs = model.shape(node.name).sizes if node.name in model else None
            if mine != theirs:
                found = "not in the model" if theirs is None else f"{theirs} in the model"
                raise LoweringError(
                    f"stage {stage.index}'s {node.op} {node.name!r} (sizes {mine}) is {found}: "
                    "the model is not the one the pipeline cuts",
                    node=node.name,
                )


def lower_pipeline(
    pipeline: Any,
    devices: Sequence[Any] | int | None = None,
    *,
    optimizer: str | None = None,
    learning_rate: float = DEFAULT_LEARNING_RATE,
) -> PipelinedLowered:
    """``pipeline`` (a :class:`~pcgopt.extract.strategies.pipeline.PipelinePlan`, or one read
    back from a plan file, :class:`~pcgopt.lower.saved.SavedPipeline`) as programs on its
    stages' devices (module docstring). ``devices``: the JAX devices, or how many of
    ``jax.devices()`` (default: as many as its stages use), numbered as the plan numbers them;
    ``optimizer`` defaults to the one it was costed with."""
    from pcgopt.extract.strategies.pipeline import PipelinePlan
    from pcgopt.lower.saved import SavedPipeline

    if not isinstance(pipeline, PipelinePlan | SavedPipeline):
        raise LoweringError(
            f"lower_pipeline takes a PipelinePlan or a SavedPipeline, got {type(pipeline).__name__}"
        )
    if pipeline.schedule != "1f1b":
        raise LoweringError(
            f"a {pipeline.schedule} pipeline updates its weights one mini-batch late; only 1F1B "
            "plans (the model's own training) run"
        )
    needed = pipeline.stages[-1].devices.stop
    available = _available(needed if devices is None else devices)
    if len(available) < needed:
        raise LoweringError(
            f"the pipeline's stages use {needed} devices, {len(available)} were given (on a CPU, "
            f"set XLA_FLAGS=--xla_force_host_platform_device_count={needed} before JAX loads)"
        )
    _check_model(pipeline)
    optimizer = optimizer or pipeline.optimizer
    m = pipeline.micro_batches
    pieces: list[Piece] = []
    for stage in pipeline.stages:
        block = available[stage.devices.start : stage.devices.stop]
        small = micro_batched(stage.plan, m)
        low = lower(small, block, optimizer=optimizer, learning_rate=learning_rate)
        # The entry is what the stage before returns (its exit, brought to one layout).
        handed = {} if stage.entry is None else {stage.entry: pieces[-1].outputs[0]}
        outputs = tuple(small.outputs)
        pieces.append(
            Piece(
                stage.index,
                tuple(stage.devices),
                stage.nodes,
                low,
                handed,
                outputs,
            )
        )
    model: PCG = pipeline.model
    # The last stage returns the model's outputs, in order, as its plan names them.
    aliases = dict(zip(model.outputs, pieces[-1].outputs, strict=True))
    return PipelinedLowered(
        model,
        tuple(pieces),
        tuple(available[:needed]),
        optimizer,
        learning_rate,
        micro_batches=m,
        aliases={k: v for k, v in aliases.items() if k != v},
        stages=len(pieces),
    )
