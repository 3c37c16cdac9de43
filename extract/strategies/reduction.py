"""Synthesis of hierarchical reduction programs (P^2, sections 2.2-2.5, 3.2-3.5, 5).

A reduction over some parallelism axes (the gradient AllReduce of data parallelism, the partial
sums of tensor parallelism) need not be one AllReduce: on a machine whose nodes are joined by a
slow network, ReduceScatter inside the node, AllReduce across nodes and AllGather inside the
node again sends an eighth as much over the network on 8-GPU nodes. This module finds all such
programs for a placement and ranks them.

**States** (P^2 section 3.2, Figure 8). The data of every device is cut into ``k`` chunks, ``k``
the number of devices. A device's state says, for every chunk it holds, which devices'
original chunks have been summed into it: a boolean ``k x k`` matrix, stored here as pairs
``(contributors, chunks)`` of bit masks (chunks that share the same contributors together).
Initially device ``i`` holds every chunk with contributor ``i`` only. A collective is a Hoare
triple: its pre-condition on the states of each group rejects semantically invalid steps, its
post-condition gives the new states:

    AllReduce      members hold the same chunks, contributors disjoint -> all get the sum
    ReduceScatter  the same pre-condition -> member i gets the i-th block of the sum's chunks
    Reduce         the same pre-condition -> the first member gets the sum, the others nothing
    AllGather      members hold disjoint chunks, as many each -> all get the union
    Broadcast      the first member knows at least what every other does, and more than one
                   of them -> all get the first member's state

Every step must change the state of every group it runs on (no AllReduce of devices holding
nothing); together with the pre-conditions this bounds program length ("information
increase"). Summing the same contribution twice (Figure 4b) and summing chunks that belong to
different parts of the result (Figure 4a) are rejected.

**Programs** (section 3.3). A program is a list of :class:`Step`, each a *slice* (a level of the
synthesis hierarchy), a *form* and a collective. Levels are numbered from the root (0, a single
unit) to the innermost (``n``). The slice at level ``e`` cuts devices into the units of level
``e``; the form picks the groups:

    InsideGroup     the devices of each unit of level e (they differ below e)
    Parallel(a)     the r-th device of each unit of level e, over the units of level e inside the
                    same unit of level a (they differ at levels a+1..e), for every r
    Master(a)       the same, for r = 0 only (the first device of each unit of level e), one
                    group per unit of level a. P^2's Table 2 shows Master only under a root
                    of one unit; one group per unit of ``a`` is our generalization, which
                    lets a hierarchical Reduce run at every level (every lowered program is
                    still checked against the state semantics by :func:`execute`)

**Synthesis hierarchy** (sections 2.5, 3.4). Programs are synthesized over the factors of the
reduction axes only, one level per hardware level where they are split (factors of several
reduction axes on the same hardware level collapsed into one; P^2 proves this hierarchy at least
as expressive as the others), and lowered to the full machine by running the same groups in
every reduction group of the placement (:meth:`ParallelismMatrix.groups`): synthesis device
``r`` is the ``r``-th device, by number, of each reduction group. :func:`synthesize` enumerates,
in increasing size up to ``max_size`` steps (5, as in P^2), every program whose final state is
the requested reduction; :func:`execute` runs a lowered program on the states of the whole
machine and checks it.

**Simulation** (section 5). :func:`simulate` prices each step with
:func:`pcgopt.extract.costmodel.cost.collective_cost` (flat alpha-beta algorithms; the groups of a
step run at once and share the links of the units they occupy, so contention on a node's network
link is counted) on the step's per-device message, and adds the steps. :func:`best_reduction` ranks
every (placement, program) pair. The cost model uses the best program for an AllReduce or Reduce
that spans levels of the hierarchy (:func:`best_program`).

>>> from pcgopt.machine import Machine
>>> programs = synthesize([2, 8], [2, 8], [1], [[2, 1], [1, 8]])
>>> len(programs), programs[0]
(3, ReductionProgram(AllReduce[L1]))
>>> m = Machine.preset("dgx-a100", nodes=2)
>>> for report in explore(m, [16, 2], [0]):  # reduce over axis 0, on either placement
...     best = report.best
...     print(best.matrix.to_list(), best.program.describe(m), f"{best.speedup:.2f}x")
[[1, 16], [2, 1]] AllReduce[gpu] 1.00x
[[2, 8], [1, 2]] ReduceScatter[gpu] ; AllReduce[node] ; AllGather[gpu] 1.83x
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

from pcgopt.extract.costmodel.cost import CollectiveCost, collective_cost
from pcgopt.extract.strategies.placement import (
    ParallelismMatrix,
    PlacementError,
    matrices,
    reduce_axes_of,
)
from pcgopt.machine import Machine

__all__ = [
    "COLLECTIVE_OPS",
    "FORMS",
    "InvalidStep",
    "MatrixReport",
    "ProgramCost",
    "RankedReduction",
    "ReductionError",
    "ReductionProgram",
    "Step",
    "apply_collective",
    "best_program",
    "best_reduction",
    "chunk_list",
    "execute",
    "explore",
    "initial_state",
    "run_lowered",
    "simulate",
    "synthesize",
    "timeline",
]

CollectiveOp = Literal["AllReduce", "ReduceScatter", "AllGather", "Reduce", "Broadcast"]
COLLECTIVE_OPS: tuple[str, ...] = get_args(CollectiveOp)
Form = Literal["InsideGroup", "Parallel", "Master"]
FORMS: tuple[str, ...] = get_args(Form)
Target = Literal["all_reduce", "reduce"]
_TARGETS: tuple[str, ...] = get_args(Target)

# The cost model's name of each collective.
_KIND = {
    "AllReduce": "all_reduce",
    "ReduceScatter": "reduce_scatter",
    "AllGather": "all_gather",
    "Reduce": "reduce",
    "Broadcast": "broadcast",
}

# A device's state: sorted (contributors, chunks) bit-mask pairs, chunks disjoint between pairs.
DeviceState = tuple[tuple[int, int], ...]
State = tuple[DeviceState, ...]


class ReductionError(PlacementError):
    """A reduction request, program or machine that does not fit; the message says why."""


class InvalidStep(ReductionError):
    """A collective whose pre-condition fails on the current states (P^2 Figure 8), or whose
    result can no longer reach the requested reduction."""


# --- State semantics (P^2 section 3.2) ----------------------------------------------------------


def initial_state(num_devices: int) -> State:
    """Every device holds all ``num_devices`` chunks of its own data."""
    every = (1 << num_devices) - 1
    return tuple(((1 << d, every),) for d in range(num_devices))


def _chunks(s: DeviceState) -> int:
    out = 0
    for _, rows in s:
        out |= rows
    return out


def chunk_list(s: DeviceState) -> list[int]:
    """The chunks a device state holds, in increasing order (the order ReduceScatter splits
    them in)."""
    held = _chunks(s)
    return [i for i in range(held.bit_length()) if held >> i & 1]


def _held(state: State, groups: Sequence[Sequence[int]]) -> int:
    """The most chunks the first member of any of ``groups`` holds: what a step sends."""
    return max(_chunks(state[g[0]]).bit_count() for g in groups)


def _normal(entries: Iterable[tuple[int, int]]) -> DeviceState:
    merged: dict[int, int] = {}
    for contributors, rows in entries:
        if rows:
            merged[contributors] = merged.get(contributors, 0) | rows
    return tuple(sorted(merged.items()))


def _restrict(s: DeviceState, rows: int) -> DeviceState:
    return _normal((c, r & rows) for c, r in s)


def _sum(states: Sequence[DeviceState], what: str) -> DeviceState:
    """The chunk-wise sum of ``states``: they must hold the same chunks with disjoint
    contributors (R-AllReduce's pre-condition)."""
    first = _chunks(states[0])
    if not first:
        raise InvalidStep(f"{what}: the first member holds no data")
    acc = list(states[0])
    for s in states[1:]:
        if _chunks(s) != first:
            raise InvalidStep(f"{what}: members hold different chunks (Figure 4a)")
        nxt = []
        for c1, r1 in acc:
            for c2, r2 in s:
                both = r1 & r2
                if both:
                    if c1 & c2:
                        raise InvalidStep(
                            f"{what}: a contribution would be summed twice (Figure 4b)"
                        )
                    nxt.append((c1 | c2, both))
        acc = nxt
    return _normal(acc)


def _contains(big: DeviceState, small: DeviceState) -> bool:
    """Whether ``big`` knows at least what ``small`` does (matrix ``small <= big``)."""
    if _chunks(small) & ~_chunks(big):
        return False
    for cs, rs in small:
        for cb, rb in big:
            if rs & rb and cs & ~cb:
                return False
    return True


def apply_collective(op: str, states: Sequence[DeviceState]) -> list[DeviceState]:
    """The states of one group after ``op`` (one of :data:`COLLECTIVE_OPS`), the first member
    being the root; raises :class:`InvalidStep` when the pre-condition fails."""
    if op not in COLLECTIVE_OPS:
        raise ReductionError(f"unknown collective {op!r}; valid: {', '.join(COLLECTIVE_OPS)}")
    p = len(states)
    if p < 2:
        raise InvalidStep(f"{op} needs a group of at least 2 devices")
    if op in ("AllReduce", "ReduceScatter", "Reduce"):
        total = _sum(states, op)
        if op == "AllReduce":
            return [total] * p
        if op == "Reduce":
            return [total] + [()] * (p - 1)
        rows = chunk_list(total)
        if len(rows) % p:
            raise InvalidStep(f"ReduceScatter: {len(rows)} chunks do not split over {p} devices")
        block = len(rows) // p
        out = []
        for i in range(p):
            mask = 0
            for r in rows[i * block : (i + 1) * block]:
                mask |= 1 << r
            out.append(_restrict(total, mask))
        return out
    if op == "AllGather":
        held = [_chunks(s) for s in states]
        if not held[0] or len({h.bit_count() for h in held}) != 1:
            raise InvalidStep("AllGather: members must hold as many chunks each, at least one")
        seen = 0
        for h in held:
            if h & seen:
                raise InvalidStep("AllGather: members hold overlapping chunks")
            seen |= h
        union = _normal(e for s in states for e in s)
        return [union] * p
    if op == "Broadcast":
        root = states[0]
        if not all(_contains(root, s) for s in states[1:]):
            raise InvalidStep("Broadcast: the root knows less than another member")
        if all(s == root for s in states[1:]):
            raise InvalidStep("Broadcast: every member already holds the root's data")
        return [root] * p
    raise ReductionError(f"unknown collective {op!r}; valid: {', '.join(COLLECTIVE_OPS)}")


def _step(state: State, op: str, groups: Sequence[Sequence[int]], targets: Sequence[int]) -> State:
    """``op`` run in every group at once; every group must change, and no device may gain a
    contributor outside its target (it could never lose it again: Lemma B.3)."""
    new = list(state)
    for g in groups:
        before = [state[d] for d in g]
        after = apply_collective(op, before)
        if after == before:
            raise InvalidStep(f"{op} on {list(g)} changes nothing")
        for d, s in zip(g, after, strict=True):
            for contributors, _ in s:
                if contributors & ~targets[d]:
                    raise InvalidStep(
                        f"{op} on {list(g)} sums into device {d} data it must not reduce with"
                    )
            new[d] = s
    return tuple(new)


def _is_final(state: State, targets: Sequence[int], roots: Sequence[int], target: str) -> bool:
    every = (1 << len(state)) - 1
    if target == "all_reduce":
        return all(s == ((targets[d], every),) for d, s in enumerate(state))
    return all(state[r] == ((targets[r], every),) for r in roots)


# --- The DSL (P^2 section 3.3) ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Step:
    """One reduction instruction: ``collective`` run in the groups that ``slice`` (a synthesis
    level, 0 the root) and ``form`` (with ``ancestor``, the level of ``Parallel(e)`` or
    ``Master(e)``) derive."""

    collective: str
    slice: int
    form: str
    ancestor: int | None = None

    def __post_init__(self) -> None:
        if self.collective not in COLLECTIVE_OPS:
            raise ReductionError(
                f"unknown collective {self.collective!r}; valid: {', '.join(COLLECTIVE_OPS)}"
            )
        if self.form not in FORMS:
            raise ReductionError(f"unknown form {self.form!r}; valid: {', '.join(FORMS)}")
        if isinstance(self.slice, bool) or not isinstance(self.slice, int) or self.slice < 0:
            raise ReductionError(f"slice must be a level number >= 0, got {self.slice!r}")
        if self.form == "InsideGroup":
            if self.ancestor is not None:
                raise ReductionError("InsideGroup takes no ancestor level")
        elif (
            isinstance(self.ancestor, bool)
            or not isinstance(self.ancestor, int)
            or not 0 <= self.ancestor < self.slice
        ):
            raise ReductionError(
                f"{self.form}(e) needs an ancestor level 0 <= e < slice {self.slice}, got "
                f"{self.ancestor!r}"
            )

    def __repr__(self) -> str:
        form = self.form if self.ancestor is None else f"{self.form}({self.ancestor})"
        return f"Step({self.slice}, {form}, {self.collective})"

    def varied(self, depth: int) -> tuple[int, ...]:
        """The synthesis levels (1..depth) whose digit differs inside a group."""
        if self.form == "InsideGroup":
            return tuple(range(self.slice + 1, depth + 1))
        assert self.ancestor is not None
        return tuple(range(self.ancestor + 1, self.slice + 1))

    def groups(self, counts: Sequence[int]) -> tuple[tuple[int, ...], ...]:
        """The groups of synthesis devices (ranks, mixed radix over ``counts``) of this step."""
        return _groups(tuple(counts), self.slice, self.form, self.ancestor)


@functools.lru_cache(maxsize=4096)
def _groups(
    counts: tuple[int, ...], slice_: int, form: str, ancestor: int | None
) -> tuple[tuple[int, ...], ...]:
    depth = len(counts)
    step = Step("AllReduce", slice_, form, ancestor)
    varied = set(step.varied(depth))
    by_key: dict[tuple[int, ...], list[int]] = {}
    for rank in range(math.prod(counts)):
        digits, rest = [], rank
        for c in reversed(counts):
            digits.append(rest % c)
            rest //= c
        digits.reverse()
        if form == "Master" and any(digits[i] for i in range(slice_, depth)):
            continue  # Master: only the first device of each unit of the slice level
        key = tuple(d for i, d in enumerate(digits) if i + 1 not in varied)
        by_key.setdefault(key, []).append(rank)
    return tuple(tuple(g) for g in by_key.values())


def _instructions(counts: tuple[int, ...]) -> list[tuple[Step, tuple[tuple[int, ...], ...]]]:
    """Every (slice, form) of a synthesis hierarchy with its groups, without two that form the
    same groups and without those whose groups are single devices."""
    depth = len(counts)
    out, seen = [], set()
    candidates = [Step("AllReduce", e, "InsideGroup") for e in range(depth)]
    for e in range(1, depth):
        for a in range(e):
            candidates += [Step("AllReduce", e, "Parallel", a), Step("AllReduce", e, "Master", a)]
    for step in candidates:
        groups = step.groups(counts)
        if all(len(g) < 2 for g in groups) or groups in seen:
            continue
        seen.add(groups)
        out.append((step, groups))
    return out


@functools.lru_cache(maxsize=256)
def _synthesize_counts(
    counts: tuple[int, ...], max_size: int, target: str
) -> tuple[tuple[tuple[Step, ...], tuple[int, ...]], ...]:
    """Every program over the synthesis hierarchy ``counts`` reaching ``target``, shortest
    first, with the number of chunks the first member of a group holds before each step
    (what the step sends; the largest over its groups). Syntax-guided enumeration with
    memoized suffixes: states reached by different prefixes are explored once."""
    k = math.prod(counts)
    every = (1 << k) - 1
    targets = [every] * k
    instructions = [
        (Step(op, s.slice, s.form, s.ancestor), groups)
        for s, groups in _instructions(counts)
        for op in COLLECTIVE_OPS
    ]
    Suffix = tuple[tuple[Step, ...], tuple[int, ...]]
    memo: dict[tuple[State, int], list[Suffix]] = {}

    def suffixes(state: State, budget: int) -> list[Suffix]:
        if _is_final(state, targets, (0,), target):
            return [((), ())]
        if budget == 0:
            return []
        key = (state, budget)
        if key in memo:
            return memo[key]
        out: list[Suffix] = []
        for step, groups in instructions:
            try:
                new = _step(state, step.collective, groups, targets)
            except InvalidStep:
                continue
            held = _held(state, groups)
            out.extend(
                ((step, *steps), (held, *helds)) for steps, helds in suffixes(new, budget - 1)
            )
        memo[key] = out
        return out

    programs = suffixes(initial_state(k), max_size)
    return tuple(sorted(programs, key=lambda p: (len(p[0]), [repr(s) for s in p[0]])))


# --- Programs on a machine -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReductionProgram:
    """A synthesized program with what lowers it to the whole machine: ``levels``, the synthesis
    hierarchy as ``(hardware level, count)`` outermost first; ``groups``, the reduction groups
    on the machine (each sorted; synthesis device ``r`` is member ``r`` of every group);
    ``hierarchy``, the machine's level counts; ``target``, ``"all_reduce"`` (every member ends
    with the sum) or ``"reduce"`` (the first member does)."""

    steps: tuple[Step, ...]
    levels: tuple[tuple[int, int], ...]
    groups: tuple[tuple[int, ...], ...]
    hierarchy: tuple[int, ...]
    target: str = "all_reduce"

    def __repr__(self) -> str:
        return f"ReductionProgram({self.describe() or 'nothing to reduce'})"

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def counts(self) -> tuple[int, ...]:
        return tuple(c for _, c in self.levels)

    def step_levels(self, step: Step) -> tuple[int, ...]:
        """The hardware levels across which the groups of ``step`` reach."""
        return tuple(self.levels[i - 1][0] for i in step.varied(len(self.levels)))

    def describe(self, machine: Machine | None = None) -> str:
        """Each step as its collective and the hardware levels its groups span, e.g.
        ``ReduceScatter[gpu] ; AllReduce[node] ; AllGather[gpu]`` (level names from ``machine``,
        else ``L0``, ``L1``, ... outermost first); ``first`` marks a Master step (only the first
        device of each unit takes part)."""
        names = (
            [level.name for level in machine.levels]
            if machine is not None
            else [f"L{j}" for j in range(len(self.hierarchy))]
        )
        parts = []
        for step in self.steps:
            where = "+".join(names[j] for j in self.step_levels(step))
            first = ", first" if step.form == "Master" else ""
            parts.append(f"{step.collective}[{where}{first}]")
        return " ; ".join(parts)

    def lowered(self) -> list[tuple[str, tuple[tuple[int, ...], ...]]]:
        """The program on the machine: per step, the collective and its device groups."""
        out = []
        for step in self.steps:
            groups = step.groups(self.counts)
            out.append(
                (
                    step.collective,
                    tuple(tuple(g[r] for r in sg) for g in self.groups for sg in groups),
                )
            )
        return out


def _matrix(
    hierarchy: Sequence[int], axes: Sequence[int], matrix: ParallelismMatrix | Sequence
) -> ParallelismMatrix:
    if isinstance(matrix, ParallelismMatrix):
        if matrix.hierarchy != tuple(hierarchy) or matrix.axes != tuple(axes):
            raise ReductionError(
                f"{matrix!r} is for hierarchy {list(matrix.hierarchy)} and axes "
                f"{list(matrix.axes)}, not {list(hierarchy)} and {list(axes)}"
            )
        return matrix
    return ParallelismMatrix(tuple(hierarchy), tuple(axes), tuple(tuple(r) for r in matrix))


def _check_target(target: str) -> None:
    if target not in _TARGETS:
        raise ReductionError(f"target must be one of {', '.join(_TARGETS)}; got {target!r}")


def _check_size(max_size: object) -> int:
    if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 1:
        raise ReductionError(f"max_size must be a positive integer, got {max_size!r}")
    return max_size


def synthesize(
    hierarchy: Sequence[int],
    axes: Sequence[int],
    reduce_axes: int | Iterable[int],
    matrix: ParallelismMatrix | Sequence[Sequence[int]],
    max_size: int = 5,
    *,
    target: Target = "all_reduce",
) -> list[ReductionProgram]:
    """Every valid program of at most ``max_size`` steps that reduces over ``reduce_axes`` under
    the placement ``matrix`` (rows per axis of ``axes``, columns per level of ``hierarchy``),
    shortest first. A reduction over axes of size 1 needs no step: the one program is empty."""
    m = _matrix(hierarchy, axes, matrix)
    reduce_t = reduce_axes_of(reduce_axes, len(m.axes))
    _check_target(target)
    _check_size(max_size)
    levels = m.reduction_levels(reduce_t)
    groups = m.groups(reduce_t)
    if not levels:
        return [ReductionProgram((), (), groups, m.hierarchy, target)]
    counts = tuple(c for _, c in levels)
    return [
        ReductionProgram(steps, levels, groups, m.hierarchy, target)
        for steps, _ in _synthesize_counts(counts, max_size, target)
    ]


def run_lowered(
    steps: Iterable[tuple[str, Iterable[Iterable[int]]]],
    groups: Iterable[Iterable[int]],
    num_devices: int,
    *,
    target: Target = "all_reduce",
) -> State:
    """Runs collectives on explicit device groups, ``[(op, groups), ...]``, from the initial
    state of ``num_devices`` devices, for the reduction within ``groups``; returns the final
    states. Raises :class:`InvalidStep` at the first step whose pre-condition fails (Figure 8),
    that changes nothing, or that sums into a device data from outside its reduction group
    (it could never be taken out again), and if the end is not the requested reduction."""
    _check_target(target)
    if isinstance(num_devices, bool) or not isinstance(num_devices, int) or num_devices < 1:
        raise ReductionError(f"num_devices must be a positive integer, got {num_devices!r}")
    # A device outside every reduction group must end as it started: its target is itself.
    targets = [1 << d for d in range(num_devices)]
    reduction = [tuple(g) for g in groups]
    covered: set[int] = set()
    for g in reduction:
        _check_disjoint_groups([g], num_devices, covered, "reduction group")
        mask = sum(1 << d for d in g)
        for d in g:
            targets[d] = mask
    state = initial_state(num_devices)
    for i, (op, step_groups) in enumerate(steps):
        groups_t = [tuple(g) for g in step_groups]
        _check_disjoint_groups(groups_t, num_devices, set(), f"step {i} ({op})")
        state = _step(state, op, groups_t, targets)
    if any(len(g) > 1 for g in reduction):
        every = (1 << num_devices) - 1
        for g in reduction:
            done = (
                all(state[d] == ((targets[d], every),) for d in g)
                if target == "all_reduce"
                else state[g[0]] == ((targets[g[0]], every),)
            )
            if not done:
                raise InvalidStep(f"the steps end before the requested {target} in group {list(g)}")
    return state


def _check_disjoint_groups(
    groups: Sequence[tuple[int, ...]], num_devices: int, seen: set[int], what: str
) -> None:
    for g in groups:
        for d in g:
            if isinstance(d, bool) or not isinstance(d, int) or not 0 <= d < num_devices:
                raise ReductionError(f"{what}: device {d!r} is not one of 0..{num_devices - 1}")
            if d in seen:
                raise ReductionError(
                    f"{what}: device {d} is in two groups; the groups of a collective are disjoint"
                )
            seen.add(d)


def execute(program: ReductionProgram) -> State:
    """Runs the lowered program on the states of every device of the machine
    (:func:`run_lowered`) and returns the final states; raises :class:`InvalidStep` if a step is
    invalid or the end is not the requested reduction."""
    return run_lowered(
        program.lowered(), program.groups, math.prod(program.hierarchy), target=program.target
    )


def _walk(program: ReductionProgram) -> Iterator[tuple[Step, tuple[tuple[int, ...], ...], int]]:
    """Each step of ``program`` with its synthesis groups and the largest number of chunks a
    member holds before it (the root's, for Broadcast)."""
    counts = program.counts
    k = math.prod(counts) if counts else 1
    state = initial_state(k)
    targets = [(1 << k) - 1] * k
    for step in program.steps:
        sgroups = step.groups(counts)
        yield step, sgroups, _held(state, sgroups)
        state = _step(state, step.collective, sgroups, targets)


def _step_cost(
    program: ReductionProgram,
    step: Step,
    sgroups: tuple[tuple[int, ...], ...],
    held: int,
    machine: Machine,
    bytes_per_device: float,
) -> CollectiveCost:
    k = math.prod(program.counts)
    p = len(sgroups[0])
    nbytes = bytes_per_device / k * held * (p if step.collective == "AllGather" else 1)
    physical = [tuple(g[r] for r in sg) for g in program.groups for sg in sgroups]
    return collective_cost(_KIND[step.collective], physical, nbytes, machine, algorithm="flat")


def _require_machine(machine: object) -> None:
    if not isinstance(machine, Machine):
        raise ReductionError(f"machine must be a pcgopt.Machine, got {machine!r}")


def _check_machine(program: ReductionProgram, machine: Machine, bytes_per_device: float) -> None:
    _require_machine(machine)
    if machine.counts != program.hierarchy:
        raise ReductionError(
            f"the program was synthesized for hierarchy {list(program.hierarchy)}; machine "
            f"{machine.name!r} has {list(machine.counts)}"
        )
    if (
        isinstance(bytes_per_device, bool)
        or not isinstance(bytes_per_device, int | float)
        or not bytes_per_device >= 0
    ):
        raise ReductionError(f"bytes_per_device must be a number >= 0, got {bytes_per_device!r}")


def timeline(
    program: ReductionProgram, machine: Machine, bytes_per_device: float
) -> list[CollectiveCost]:
    """The cost of each step on ``machine`` (see the module docstring, "Simulation"), for
    ``bytes_per_device`` bytes to reduce on every device."""
    _check_machine(program, machine, bytes_per_device)
    return [
        _step_cost(program, step, sgroups, held, machine, bytes_per_device)
        for step, sgroups, held in _walk(program)
    ]


def simulate(program: ReductionProgram, machine: Machine, bytes_per_device: float) -> float:
    """The predicted seconds of ``program`` on ``machine`` with ``bytes_per_device`` bytes to
    reduce on every device: the sum of its steps' :func:`timeline`."""
    return float(sum(c.seconds for c in timeline(program, machine, bytes_per_device)))


# --- Ranking placements and programs -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RankedReduction:
    """A (placement, program) pair with its predicted time and that of one AllReduce on the
    same placement."""

    matrix: ParallelismMatrix
    program: ReductionProgram
    seconds: float
    allreduce_seconds: float

    @property
    def speedup(self) -> float:
        """How much faster than a single AllReduce on the same placement."""
        return self.allreduce_seconds / self.seconds if self.seconds else 1.0

    def __repr__(self) -> str:
        return (
            f"RankedReduction({self.matrix.to_list()}, {self.program.describe()}, "
            f"{self.seconds * 1e3:.3f} ms, {self.speedup:.2f}x over AllReduce)"
        )


@dataclass(frozen=True, slots=True)
class MatrixReport:
    """One placement: every valid program with its time, fastest first, and the time of a
    single AllReduce."""

    matrix: ParallelismMatrix
    programs: tuple[tuple[ReductionProgram, float], ...]
    allreduce_seconds: float

    @property
    def best(self) -> RankedReduction:
        program, seconds = self.programs[0]
        return RankedReduction(self.matrix, program, seconds, self.allreduce_seconds)


def explore(
    machine: Machine,
    axes: Sequence[int],
    reduce_axes: int | Iterable[int],
    *,
    bytes_per_device: float = 2**31,
    max_size: int = 5,
    target: Target = "all_reduce",
) -> list[MatrixReport]:
    """For every placement of ``axes`` on ``machine``'s hierarchy, every program reducing over
    ``reduce_axes`` with its simulated time, for ``bytes_per_device`` bytes on every device
    (default 2 GiB: the 2^29 float32 values per device and node of P^2's experiments)."""
    _require_machine(machine)
    axes_t = tuple(axes)
    reports = []
    for m in matrices(machine.counts, axes_t):
        programs = synthesize(machine.counts, axes_t, reduce_axes, m, max_size, target=target)
        timed = sorted(
            ((p, simulate(p, machine, bytes_per_device)) for p in programs),
            key=lambda pt: (pt[1], len(pt[0])),
        )
        # One AllReduce (Reduce) over the whole group: the root's InsideGroup step.
        one = Step("AllReduce" if target == "all_reduce" else "Reduce", 0, "InsideGroup")
        single = next((t for p, t in timed if p.steps == (one,)), timed[0][1])
        reports.append(MatrixReport(m, tuple(timed), single))
    return reports


def best_reduction(
    machine: Machine,
    axes: Sequence[int],
    reduce_axes: int | Iterable[int],
    *,
    bytes_per_device: float = 2**31,
    max_size: int = 5,
    top: int | None = 10,
    target: Target = "all_reduce",
) -> list[RankedReduction]:
    """The fastest (placement, program) pairs for reducing over ``reduce_axes`` of ``axes`` on
    ``machine``, ranked by simulated time (``top`` of them, or all with ``top=None``)."""
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 1):
        raise ReductionError(f"top must be a positive integer or None, got {top!r}")
    ranked = [
        RankedReduction(r.matrix, p, t, r.allreduce_seconds)
        for r in explore(
            machine,
            axes,
            reduce_axes,
            bytes_per_device=bytes_per_device,
            max_size=max_size,
            target=target,
        )
        for p, t in r.programs
    ]
    ranked.sort(key=lambda r: (r.seconds, len(r.program)))
    return ranked if top is None else ranked[:top]


# --- The cost model's hook ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Lines:
    """Every program of a group layout with its cost per level as affine functions of the
    message: seconds ``a + b * nbytes`` and bytes ``c * nbytes``, arrays (programs, levels)."""

    programs: tuple[ReductionProgram, ...]
    seconds_a: np.ndarray
    seconds_b: np.ndarray
    bytes_c: np.ndarray


@functools.lru_cache(maxsize=4096)
def _program_lines(
    machine: Machine, groups: tuple[tuple[int, ...], ...], target: str, max_size: int
) -> _Lines | None:
    """None when the groups are not a regular layout on the hierarchy (then no synthesis
    hierarchy describes them). Each step's alpha-beta time is affine in its message."""
    spans = {tuple((s.index, s.participants) for s in machine.group_levels(g)) for g in groups}
    if len(spans) != 1:
        return None
    (levels,) = spans
    if not levels or math.prod(p for _, p in levels) != len(groups[0]):
        return None
    counts = tuple(p for _, p in levels)
    synthesized = _synthesize_counts(counts, max_size, target)
    programs = tuple(
        ReductionProgram(steps, levels, groups, machine.counts, target) for steps, _ in synthesized
    )
    if not programs:
        return None
    names = [level.name for level in machine.levels]
    shape = (len(programs), len(names))
    seconds_a, seconds_b, bytes_c = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    # Programs share steps: each distinct (step, chunks held) is priced once, at two sizes.
    probe = 2.0**20
    memo: dict[tuple[Step, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for i, (program, (_, helds)) in enumerate(zip(programs, synthesized, strict=True)):
        for step, held in zip(program.steps, helds, strict=True):
            line = memo.get((step, held))
            if line is None:
                sgroups = step.groups(counts)
                c1, c2 = (
                    _step_cost(program, step, sgroups, held, machine, size)
                    for size in (probe, 2 * probe)
                )
                t1 = np.array([c1.seconds_per_level[n] for n in names])
                t2 = np.array([c2.seconds_per_level[n] for n in names])
                b1 = np.array([c1.bytes_per_level[n] for n in names])
                line = memo[step, held] = (2 * t1 - t2, (t2 - t1) / probe, b1 / probe)
            seconds_a[i] += line[0]
            seconds_b[i] += line[1]
            bytes_c[i] += line[2]
    return _Lines(programs, seconds_a, seconds_b, bytes_c)


@dataclass(frozen=True, slots=True)
class ProgramCost:
    """The fastest synthesized program for a reduction and its cost, per level of the machine
    (``seconds_per_level``: each step's time on the level whose link limits it;
    ``bytes_per_level``: bytes sent, by the outermost level a message crosses)."""

    program: ReductionProgram
    seconds: float
    seconds_per_level: tuple[float, ...]
    bytes_per_level: tuple[float, ...]


def best_program(
    groups: Iterable[Iterable[int]],
    nbytes: float,
    machine: Machine,
    *,
    target: Target = "all_reduce",
    max_size: int = 5,
) -> ProgramCost | None:
    """The fastest synthesized program for an AllReduce (``target="all_reduce"``) or a Reduce to
    the first member (``"reduce"``) of ``nbytes`` per device within each of ``groups`` (all at
    once) on ``machine``; None when the groups do not form a regular layout on the hierarchy.
    Programs are synthesized once per group layout and their costs kept as affine functions of
    the message, so repeated calls cost a lookup.

    >>> m = Machine.preset("dgx-a100", nodes=2)
    >>> best = best_program([range(32)], 2**30, m)
    >>> best.program.describe(m), round(best.seconds * 1e3, 1)
    ('ReduceScatter[gpu] ; AllReduce[node] ; AllGather[gpu]', 141.8)
    """
    _check_target(target)
    _check_size(max_size)
    _require_machine(machine)
    if (
        isinstance(nbytes, bool)
        or not isinstance(nbytes, int | float)
        or not math.isfinite(nbytes)
        or nbytes < 0
    ):
        raise ReductionError(f"nbytes must be a finite number >= 0, got {nbytes!r}")
    key = tuple(tuple(sorted(g)) for g in groups)
    lines = _program_lines(machine, key, target, max_size)
    if lines is None:
        return None
    n = float(nbytes)
    if n == 0:  # nothing to send: no step runs (as in simulate)
        zeros = (0.0,) * len(machine.levels)
        return ProgramCost(lines.programs[0], 0.0, zeros, zeros)
    per_level = lines.seconds_a + lines.seconds_b * n
    totals = per_level.sum(axis=1)
    i = int(np.argmin(totals))
    return ProgramCost(
        lines.programs[i],
        float(totals[i]),
        tuple(float(v) for v in per_level[i]),
        tuple(float(v) for v in lines.bytes_c[i] * n),
    )
