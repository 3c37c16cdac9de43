"""One training iteration simulated task by task: what overlaps and what waits.

:func:`~pcgopt.extract.costmodel.cost.iteration_cost` prices every node (its compute, its
collectives, its weight's gradient synchronization and update); this module puts those prices on a
timeline the way a data-parallel runtime runs them (PyTorch DDP, Megatron, XLA), as FlexFlow's
task-graph simulator does for Unity (Unity section 5, "cost estimation"), and returns when the
iteration ends. What a runtime does is one value, :class:`Runtime`, documented here and nowhere
else.

**Streams.** Every device has a compute stream and, with ``Runtime.overlap``, a communication
stream (one NCCL stream; without overlap, collectives run on the compute stream). A stream runs
its tasks one at a time in the order the program issues them; a task starts when its stream is
free and its inputs are ready. Under the cost model's default placement every node's tasks
include device 0 (groups are consecutive devices from 0), so device 0's two streams are the
iteration's: the timeline is device 0's, and every task lists how many devices (from 0) run it
(with explicit device groups, the devices up to the last one its groups name). Under a machine
mapping ("Mapped" below) every device's streams are tracked apart.

**The program.** Forward: the nodes in the PCG's order (the plan's own; extractions list each
layout change just before its first reader, :func:`pcgopt.graph.layout_changes_late`); a compute
node is a task on the compute
stream, a parallelization node's forward collective a task on the communication stream that its
readers wait for; sources and the layouts they are loaded or stored in are ready at 0. Backward,
once the whole forward has run: the nodes in reverse order, as autograd runs them; a node's output
gradient is ready when every reader that sends one back has run its backward; a compute node's
backward (every input gradient, one task) runs on the compute stream, a parallelization node's
dual collective on the communication stream. Operators that move no data pass gradients on at no
cost.

**Gradient buckets.** A replicated trainable weight's gradient is ready when the last reader of its
stored layout has run its backward. It joins the open bucket of its device groups (weights
synchronized over different groups, or, under a mapping, over the same groups on different blocks,
are in different buckets, as in different process groups); a bucket is issued, as one collective of
all its bytes on the communication stream (AllReduce; ReduceScatter under ZeRO-2), when it holds
``Runtime.bucket_bytes`` (PyTorch DDP's default, 25 MiB) and, for the last partial bucket of each
group, when the backward ends. A bucket costs the cheaper of one collective of its bytes and its
gradients' own (the cost model picks each collective's algorithm by size, so for uneven sizes the
sum can be the cheaper). ``bucket_bytes=0``: every gradient alone, when ready.
DDP's smaller first bucket and its reordering of buckets after the first iteration are not
modelled.

**The update.** The optimizer step runs on the compute stream after the backward and every bucket
have finished (``optimizer.step()`` after ``backward()`` returns), one task for all weights (under
a mapping, one per device block, at once). Under ZeRO (``Runtime.zero_stage``) each device updates
its shard of every weight stored in copies, and the updated weights are then all-gathered on the
communication stream, one task per gradient bucket, the cheaper of one all-gather of its bytes and
its weights' own.

**Gradient accumulation** (``micro_batches=m``). Each node's price is the cost model's for the whole
iteration (a node on the data path runs once per micro-batch; one computed from weights only is
priced once); each micro-batch is charged ``1/m`` of it. The first ``m - 1`` micro-batches run
forward and backward without gradient synchronization (DDP's ``no_sync``), each taking the same time
``P``; the last one synchronizes and updates. The iteration takes ``(m - 1) P + P_last``:
consecutive micro-batches are not overlapped (an upper bound).

**Mapped** (:meth:`Simulation.run` with ``offsets``: a machine mapping's, through
:meth:`~pcgopt.extract.costmodel.cost.CostBreakdown.mapped_timeline`). Every node's tasks run
on its devices from its offset (its collectives' groups shifted with it: a collective costs the
same on any block of the same shape, the mapping's premise), each device with its own two
streams, so branches on disjoint devices run at once and each still overlaps its own
communication. A tensor read by a node that starts on another device than its producer arrives
one message later (``latency + bytes / bandwidth`` over the link of the outermost level where
they differ, the mapping's price; not on a stream, so messages do not contend), and its
gradient goes back the same way.

**What it is not.** Concurrency between nodes on the same device's compute stream (one kernel
at a time), overlap of a forward collective with the compute that reads it, contention between
a bucket and a blocking collective other than taking turns on the one communication stream, and
contention between collectives of different device blocks that cross the same links.

**Bounds** (tests check them on random plans). The simulated time is at least the compute
stream's busy time and at most the additive sum of every task (each task starts by the time the
ones issued before it have ended), which, when buckets cost no more than their gradients alone,
is at most the cost model's additive total.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from pcgopt.shapes import DType

__all__ = [
    "ADDITIVE",
    "DDP",
    "PRECISIONS",
    "ZERO_STAGES",
    "BucketCost",
    "Runtime",
    "SimNode",
    "Simulation",
    "Task",
    "Timeline",
    "TransferCost",
]


#: The precisions a runtime trains in (:class:`Runtime`): as the model's tensors say, or mixed
#: with bfloat16 or float16 compute.
PRECISIONS = ("f32", "bf16-mixed", "f16-mixed")
#: The optimizer shardings a runtime can apply (:class:`Runtime`): none, ZeRO-1, ZeRO-2.
ZERO_STAGES = (0, 1, 2)


@dataclass(frozen=True, slots=True)
class Runtime:
    """What the training runtime does (module docstring): ``overlap``, run collectives on their
    own stream beside computation; ``bucket_bytes``, gradients synchronized in buckets of at
    least this many bytes (0: each alone); ``precision``, what it computes in:

    * ``"f32"``: every tensor in its own dtype (the model's; float32 in the zoo);
    * ``"bf16-mixed"``, ``"f16-mixed"``: automatic mixed precision as ``torch.autocast`` with
      DDP (and Megatron's defaults) run it: every float32 tensor the model computes, and every
      kernel, in bfloat16 (float16), at the device's rate for it, activations kept for the
      backward at 2 bytes, collectives on activations in it; weights kept in float32 (the
      master copy) plus a 2-byte copy for the kernels, gradients, their AllReduce and the
      optimizer state in float32. A weight stored sharded and gathered where used (FSDP) is
      gathered, and its gradient reduce-scattered, in the low precision (FSDP's
      ``MixedPrecision`` default: gradients reduced in the parameters' dtype).

    ``zero_stage``: how the optimizer of a weight stored in identical copies (one whose
    gradient is synchronized) is sharded over the copies, as ZeRO does (weights sharded too,
    ZeRO-3, is a layout, not a runtime option: :func:`~pcgopt.extract.strategies.baselines.fsdp`):

    * ``0``: every copy keeps the whole optimizer state and gradient and updates the whole
      weight (DDP);
    * ``1``: ZeRO-1 (PyTorch's ``ZeroRedundancyOptimizer`` with DDP): each copy keeps and
      updates ``1/p`` of the optimizer state (``p`` the copies), the gradients are all-reduced
      in buckets as DDP does, and after the update the updated weights are all-gathered, in the
      same buckets, in the weights' dtype (float32: with autocast the parameters are the master
      copy);
    * ``2``: ZeRO-2 (DeepSpeed stage 2 with ``overlap_comm``): also gradients kept for the
      shard only, each bucket reduce-scattered instead of all-reduced; the same update and
      all-gather.

    The gathers run on the communication stream after the update (the next forward needs
    them); the buffer of a bucket in flight is not counted in memory.
    :data:`DDP` (the default of every cost) is PyTorch DDP's, in the model's precision;
    :data:`ADDITIVE` runs everything one after another and leaves every gradient alone, which
    is what extraction's per-e-node costs add up to without overlap (with it, extraction hides
    the sync behind the backward, :mod:`pcgopt.extract.search.extraction`)."""

    overlap: bool = True
    bucket_bytes: int = 25 * 2**20
    precision: str = "f32"
    zero_stage: int = 0

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(
                f"Runtime.precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}"
            )
        if not isinstance(self.overlap, bool):
            raise ValueError(f"Runtime.overlap must be True or False, got {self.overlap!r}")
        if (
            isinstance(self.bucket_bytes, bool)
            or not isinstance(self.bucket_bytes, int)
            or self.bucket_bytes < 0
        ):
            raise ValueError(
                "Runtime.bucket_bytes must be a non-negative number of bytes (0: no buckets), "
                f"got {self.bucket_bytes!r}"
            )
        if type(self.zero_stage) is not int or self.zero_stage not in ZERO_STAGES:
            raise ValueError(
                f"Runtime.zero_stage must be one of {', '.join(map(str, ZERO_STAGES))} (ZeRO-3 "
                f"is the fsdp layout), got {self.zero_stage!r}"
            )

    @property
    def additive(self) -> bool:
        """Whether the iteration is the plain sum of its tasks' times."""
        return not self.overlap and self.bucket_bytes == 0

    @property
    def compute_dtype(self) -> DType | None:
        """The dtype float32 tensors are computed in (None: their own)."""
        return None if self.precision == "f32" else DType.of(self.precision.split("-")[0])

    @property
    def sync_collective(self) -> str:
        """The collective a bucket of gradients is synchronized with."""
        return "reduce_scatter" if self.zero_stage >= 2 else "all_reduce"

    def __repr__(self) -> str:
        mixed = "" if self.precision == "f32" else f", {self.precision}"
        if self.zero_stage:
            mixed += f", ZeRO-{self.zero_stage}"
        if self.additive:
            return f"Runtime(additive{mixed})"
        buckets = (
            f"{self.bucket_bytes / 2**20:g} MiB buckets" if self.bucket_bytes else "no buckets"
        )
        return f"Runtime({'overlap' if self.overlap else 'no overlap'}, {buckets}{mixed})"


#: PyTorch DistributedDataParallel's defaults: collectives overlap computation, 25 MiB buckets.
DDP = Runtime()
#: Nothing overlaps, no buckets: the additive model.
ADDITIVE = Runtime(overlap=False, bucket_bytes=0)


class Task(NamedTuple):
    """One task of the timeline: on ``stream`` (``"compute"`` or ``"comm"``) of ``devices``
    devices from ``first_device``, from ``start_s`` to ``end_s``; ``name``: the node (or bucket,
    or ``"update"``), ``phase``: ``"forward"``, ``"backward"``, ``"sync"`` or ``"update"`` (or
    ``"unit"``: a machine mapping's unit, all of its work); ``micro_batch``: which one
    (0-based); ``of_node``: whether ``name`` is a node's (not a bucket's or the update's)."""

    stream: str
    start_s: float
    end_s: float
    name: str
    phase: str
    devices: int
    micro_batch: int = 0
    first_device: int = 0
    of_node: bool = True

    @property
    def seconds(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class Timeline:
    """When every task of one iteration runs (module docstring); ``time_s``: when the last
    ends."""

    tasks: tuple[Task, ...]
    time_s: float
    runtime: Runtime

    def on_device(self, device: int) -> tuple[Task, ...]:
        """The tasks device ``device`` takes part in, in start order."""
        return tuple(
            sorted(
                (t for t in self.tasks if t.first_device <= device < t.first_device + t.devices),
                key=lambda t: t.start_s,
            )
        )

    def busy_s(self, stream: str, device: int = 0) -> float:
        """Seconds ``stream`` of ``device`` is busy."""
        return sum(t.seconds for t in self.on_device(device) if t.stream == stream)

    def renamed(self, names: Mapping[str, str]) -> Timeline:
        """The same timeline with node ``n`` named ``names[n]`` (others kept)."""
        tasks = tuple(
            t._replace(name=names.get(t.name, t.name)) if t.of_node else t for t in self.tasks
        )
        return Timeline(tasks, self.time_s, self.runtime)

    def __repr__(self) -> str:
        return (
            f"Timeline({len(self.tasks)} tasks, {self.time_s * 1e3:.4g} ms; compute busy "
            f"{self.busy_s('compute') * 1e3:.4g} ms, communication busy "
            f"{self.busy_s('comm') * 1e3:.4g} ms; {self.runtime!r})"
        )


@dataclass(frozen=True, slots=True)
class SimNode:
    """One PCG node as the simulation sees it (built by the cost model), in the PCG's order.

    ``inputs``: positions of the nodes it reads; ``kind``: ``"compute"`` (a kernel), ``"comm"``
    (a collective), ``"free"`` (moves no data, or only loads or stores a source);
    ``forward_s``/``backward_s``: its times for all micro-batches; ``grad``: whether its output
    needs a gradient; ``devices``: devices its tasks span from its first (0 unless placed by a
    machine mapping, :meth:`Simulation.run`); ``syncs``: for a replicated trainable weight's
    layout, ``(groups, bytes, seconds, gather_seconds)``: its gradient's synchronization
    (:attr:`Runtime.sync_collective`) alone, and, under ZeRO, the all-gather of its updated
    weight alone (0 without); ``update_s``: a weight's optimizer update."""

    name: str
    inputs: tuple[int, ...]
    kind: str
    forward_s: float = 0.0
    backward_s: float = 0.0
    grad: bool = False
    devices: int = 1
    syncs: tuple[tuple[Hashable, float, float, float], ...] = ()
    update_s: float = 0.0


#: ``bucket_cost(groups, bytes, collective)``: the seconds of one ``collective``
#: (``"all_reduce"``, ``"reduce_scatter"``, ``"all_gather"``) of ``bytes`` per device over
#: ``groups``.
BucketCost = Callable[[Hashable, float, str], float]
#: ``transfer(source_device, target_device, bytes)``: the seconds of one message of ``bytes``
#: between the two devices (over the link of the outermost level where they differ).
TransferCost = Callable[[int, int, float], float]


@dataclass(frozen=True)
class Simulation:
    """One iteration's tasks, ready to be simulated (:meth:`run`), also on a machine mapping's
    devices. ``bucket_cost`` prices a bucket's collective (:data:`BucketCost`)."""

    nodes: tuple[SimNode, ...]
    update_s: float
    runtime: Runtime
    bucket_cost: BucketCost = field(repr=False, compare=False)
    micro_batches: int = 1
    update_devices: int = 1

    def run(
        self,
        *,
        offsets: Sequence[int] | None = None,
        transfer: TransferCost | None = None,
        moves: Mapping[tuple[int, int], float] | None = None,
    ) -> Timeline:
        """The timeline (module docstring). ``offsets``: each node's first device, as a
        machine mapping places it (module docstring, "Mapped"); ``moves[(j, i)]``: the bytes
        per receiving device of what node ``i`` reads from node ``j`` when they start on
        different devices, ``transfer`` their price; None: every task from device 0."""
        if offsets is not None and (transfer is None or len(offsets) != len(self.nodes)):
            raise ValueError("a mapped run needs an offset per node and a transfer cost")
        return _simulate(self, offsets, transfer, moves or {})

    def renamed(self, names: Mapping[str, str]) -> Simulation:
        """The same simulation with node ``n`` named ``names[n]`` (others kept)."""
        nodes = tuple(replace(n, name=names.get(n.name, n.name)) for n in self.nodes)
        return replace(self, nodes=nodes)


def _simulate(
    sim: Simulation,
    offsets: Sequence[int] | None,
    transfer: TransferCost | None,
    moves: Mapping[tuple[int, int], float],
) -> Timeline:
    m = sim.micro_batches
    tasks: list[Task] = []
    if m == 1:
        end = _Pass(sim, offsets, transfer, moves, 0.0, 0, True, 1.0, tasks).run()
        return Timeline(tuple(tasks), end, sim.runtime)
    scale = 1.0 / m
    first: list[Task] = []
    period = _Pass(sim, offsets, transfer, moves, 0.0, 0, False, scale, first).run()
    # The same pass shifted by whole periods; built as tuples (``_replace`` per task took most
    # of the simulation of a stage of 64 micro-batches).
    new_task = tuple.__new__
    for k in range(m - 1):
        shift = k * period
        tasks.extend(
            new_task(Task, (stream, start + shift, end + shift, name, phase, devices, k, dev, own))
            for stream, start, end, name, phase, devices, _, dev, own in first
        )
    t0 = (m - 1) * period
    end = _Pass(sim, offsets, transfer, moves, t0, m - 1, True, scale, tasks).run()
    return Timeline(tuple(tasks), end, sim.runtime)


# A bucket's member: (ready, bytes, sync seconds alone, gather seconds alone, node position).
_Member = tuple[float, float, float, float, int]


class _Pass:
    """Forward and backward of one (micro-)batch from ``t0``; the ``last`` one also
    synchronizes gradients and updates. Tasks are appended to ``tasks``.

    Streams: with ``offsets`` None every task includes device 0, so device 0's two streams are
    the only ones to track; with a mapping, every device's are, and a task starts when the
    stream is free on every device it spans."""

    def __init__(
        self,
        sim: Simulation,
        offsets: Sequence[int] | None,
        transfer: TransferCost | None,
        moves: Mapping[tuple[int, int], float],
        t0: float,
        micro_batch: int,
        last: bool,
        scale: float,
        tasks: list[Task],
    ) -> None:
        self.sim, self.nodes, self.runtime = sim, sim.nodes, sim.runtime
        self.bucket_cost, self.transfer, self.moves = sim.bucket_cost, transfer, moves
        self.t0, self.micro_batch, self.last, self.scale, self.tasks = (
            t0,
            micro_batch,
            last,
            scale,
            tasks,
        )
        n = len(self.nodes)
        self.first = [0] * n if offsets is None else list(offsets)
        width = 1
        if offsets is not None:
            width = max(f + node.devices for f, node in zip(self.first, self.nodes, strict=True))
            for f, node in zip(self.first, self.nodes, strict=True):
                for groups, *_ in node.syncs:
                    width = max(width, f + _span(groups)[1])
            width = max(width, sim.update_devices)
        self.width = width
        self.free = {"compute": [t0] * width, "comm": [t0] * width}
        self.comm = "comm" if self.runtime.overlap else "compute"

    def book(
        self,
        stream: str,
        ready: float,
        seconds: float,
        name: str,
        phase: str,
        devices: int,
        first: int = 0,
        of_node: bool = True,
    ) -> float:
        """One task on ``stream`` of ``devices`` devices from ``first``; returns its end."""
        free = self.free[stream]
        if self.width == 1:
            start = max(free[0], ready)
            end = free[0] = start + seconds
        else:
            stop = first + devices
            start = max(max(free[first:stop]), ready)
            end = start + seconds
            free[first:stop] = [end] * devices
        self.tasks.append(
            Task(stream, start, end, name, phase, devices, self.micro_batch, first, of_node)
        )
        return end

    def moved(self, source: int, reader: int) -> float:
        """Seconds to move node ``source``'s output to node ``reader``'s devices under a
        mapping (0 if they start on the same device)."""
        a, b = self.first[source], self.first[reader]
        nbytes = self.moves.get((source, reader))
        if a == b or self.transfer is None or nbytes is None:
            return 0.0
        return self.transfer(a, b, nbytes * self.scale)

    def task(self, stream: str, i: int, ready: float, seconds: float, phase: str) -> float:
        node = self.nodes[i]
        return self.book(
            stream, ready, seconds * self.scale, node.name, phase, node.devices, self.first[i]
        )

    def run(self) -> float:
        nodes, t0 = self.nodes, self.t0
        n = len(nodes)
        # Forward.
        ready = [t0] * n
        mapped = self.width > 1
        for i, node in enumerate(nodes):
            if mapped:
                after = max((ready[j] + self.moved(j, i) for j in node.inputs), default=t0)
            else:
                after = max((ready[j] for j in node.inputs), default=t0)
            if node.kind == "compute":
                ready[i] = self.task("compute", i, after, node.forward_s, "forward")
            elif node.kind == "comm" and node.forward_s:
                ready[i] = self.task(self.comm, i, after, node.forward_s, "forward")
            else:
                ready[i] = after
        loss = max(ready, default=t0)
        self.backward(loss)
        end = max(max(self.free["compute"]), max(self.free["comm"]))
        if self.last:
            end = self.update(end)
        return max(end, loss)

    def backward(self, loss: float) -> None:
        """Readers before what they read. ``grad_out[i]``: when node i's output gradient is
        complete; ``grad_in[i]``: when node i has sent its inputs theirs."""
        nodes = self.nodes
        n = len(nodes)
        readers = [0] * n
        for node in nodes:
            for j in node.inputs:
                if nodes[j].grad:
                    readers[j] += 1
        self.grad_out = [loss if readers[j] == 0 else -math.inf for j in range(n)]
        self.grad_in = [loss] * n
        self.waiting = readers[:]
        self.done = [False] * n
        self.buckets: dict[Hashable, list[_Member]] = {}
        self.filled: dict[Hashable, float] = {}
        self.issued: list[tuple[Hashable, list[_Member]]] = []
        grad_in, grad_out = self.grad_in, self.grad_out
        for i in range(n - 1, -1, -1):
            node = nodes[i]
            if self.done[i] or not node.grad:
                continue
            if node.kind == "compute" and node.backward_s:
                grad_in[i] = self.task("compute", i, grad_out[i], node.backward_s, "backward")
            elif node.kind == "comm" and node.backward_s:
                grad_in[i] = self.task(self.comm, i, grad_out[i], node.backward_s, "backward")
            else:
                grad_in[i] = grad_out[i]
                if node.syncs:
                    self.sync(i, grad_out[i])
            self.finish(i)
        for key, bucket in self.buckets.items():
            if bucket:
                self.issue(key, bucket)

    # Methods, not closures of backward: two closures that call each other hold each other,
    # and each pass would then wait for a full collection to be freed (a layer-wise search on
    # BERT-Large left 2.7 million such objects).
    def finish(self, i: int) -> None:
        """Node i has run its backward: its inputs' gradients may be complete."""
        nodes, grad_out, waiting = self.nodes, self.grad_out, self.waiting
        self.done[i] = True
        for j in nodes[i].inputs:
            if not nodes[j].grad:
                continue
            back = self.grad_in[i] + self.moved(j, i) if self.width > 1 else self.grad_in[i]
            grad_out[j] = max(grad_out[j], back)
            waiting[j] -= 1
            if waiting[j] == 0 and nodes[j].kind == "free" and not self.done[j]:
                self.resolve(j)

    def resolve(self, j: int) -> None:
        """A node that moves no data passes its gradient on as soon as it is complete."""
        self.grad_in[j] = self.grad_out[j]
        if self.nodes[j].syncs:
            self.sync(j, self.grad_out[j])
        self.finish(j)

    def sync(self, i: int, ready: float) -> None:
        """Node i's gradients join their buckets (the last pass only)."""
        if not self.last:
            return
        for groups, nbytes, seconds, gather in self.nodes[i].syncs:
            member = (ready, nbytes, seconds, gather, i)
            # Weights synchronized over the same groups where they run (under a mapping, shifted
            # to their block) share buckets: one process group.
            key = (groups, self.first[i])
            if self.runtime.bucket_bytes == 0:
                self.issue(key, [member])
                continue
            bucket = self.buckets.setdefault(key, [])
            bucket.append(member)
            self.filled[key] = self.filled.get(key, 0.0) + nbytes
            if self.filled[key] >= self.runtime.bucket_bytes:
                self.issue(key, bucket)
                self.buckets[key], self.filled[key] = [], 0.0

    def bucket_task(
        self,
        key: Hashable,
        members: list[_Member],
        kind: str,
        alone: float,
        ready: float,
        label: str,
    ) -> None:
        """One collective over a bucket (``key``: its groups at device 0 and their shift):
        the cheaper of one of all its bytes and its members' own (a collective costs the same
        shifted, the machine mapping's premise); named by its node if it has one member, else
        ``label``."""
        groups, shift = key  # type: ignore[misc]
        nbytes = sum(m[1] for m in members)
        seconds = min(self.bucket_cost(groups, nbytes, kind), alone) if len(members) > 1 else alone
        if len(members) == 1:
            label = self.nodes[members[0][4]].name
        low, high = _span(groups)
        if self.width == 1:
            low = 0  # every task includes device 0 (the cost model's default groups)
        alone_node = len(members) == 1
        self.book(self.comm, ready, seconds, label, "sync", high - low, low + shift, alone_node)

    def issue(self, key: Hashable, members: list[_Member]) -> None:
        self.issued.append((key, members))
        alone = sum(m[2] for m in members)
        ready = max(m[0] for m in members)
        label = f"bucket {len(self.issued)} ({len(members)} gradients)"
        self.bucket_task(key, members, self.runtime.sync_collective, alone, ready, label)

    def update(self, end: float) -> float:
        """The optimizer step after the backward and every bucket, then ZeRO's gathers."""
        sim = self.sim
        if sim.update_s:
            if self.width == 1:
                end = self.book(
                    "compute", end, sim.update_s, "update", "update", sim.update_devices, 0, False
                )
            else:
                # Under a mapping each block updates its own weights, at once.
                blocks: dict[tuple[int, int], float] = {}
                for i, node in enumerate(self.nodes):
                    if node.update_s:
                        block = (self.first[i], node.devices)
                        blocks[block] = blocks.get(block, 0.0) + node.update_s
                start = end
                for (first, devices), seconds in blocks.items():
                    done = self.book(
                        "compute", start, seconds, "update", "update", devices, first, False
                    )
                    end = max(end, done)
        if self.runtime.zero_stage:
            # ZeRO: every copy updated its shard; the updated weights are gathered, bucket by
            # bucket.
            for k, (key, members) in enumerate(self.issued, 1):
                alone = sum(m[3] for m in members)
                if alone:
                    label = f"gather {k} ({len(members)} weights)"
                    self.bucket_task(key, members, "all_gather", alone, end, label)
            end = max(end, max(self.free["comm"]), max(self.free["compute"]))
        return end


def _span(key: Hashable) -> tuple[int, int]:
    """The devices of a bucket's groups (at device 0): first, and one past the last."""
    if not key:
        return 0, 1
    devices = [d for group in key for d in group]  # type: ignore[attr-defined]
    return min(devices), max(devices) + 1
