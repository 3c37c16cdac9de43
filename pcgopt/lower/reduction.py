"""Synthesized reduction programs as real collectives in JAX (optional: ``pip install
pcgopt[jax]``).

:func:`run_program` executes a :class:`~pcgopt.extract.strategies.reduction.ReductionProgram` with
``jax.shard_map`` on a device mesh that mirrors the program's synthesis hierarchy: one mesh axis
``g`` over the reduction groups and one axis ``s1 .. sn`` per synthesis level, outermost first,
so that mesh position ``(g, digits)`` is member ``rank(digits)`` of reduction group ``g``. A step
whose groups vary synthesis levels ``i..j`` is one collective over the mesh axes ``s_i .. s_j``:

    AllReduce       lax.psum
    ReduceScatter   lax.psum_scatter (tiled)
    AllGather       lax.all_gather (tiled)
    Reduce          lax.psum, kept by the first member only
    Broadcast       lax.psum of the first member's data (the others contribute zeros)

Every device keeps a buffer of all ``k`` chunks (``k`` the size of a reduction group); which chunks
it holds before each step, and so which rows it sends and where the result goes, comes from the
state semantics of :mod:`pcgopt.extract.strategies.reduction`, as per-device index tables fed to the
mapped function. A ``Master`` step runs its collective in every parallel group, and only the first
devices keep the result (the state semantics say the others are untouched).

On a CPU, ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` (set before JAX starts) gives
``N`` virtual devices, enough to check a program against a plain AllReduce
(:func:`run_allreduce`) without GPUs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from pcgopt.extract.strategies.reduction import (
    ReductionError,
    ReductionProgram,
    apply_collective,
    chunk_list,
    initial_state,
)

__all__ = ["run_allreduce", "run_program"]


def _jax() -> Any:
    try:
        import jax
    except ImportError:  # pragma: no cover - exercised only without the extra
        raise ReductionError(
            "running reduction programs on JAX needs the optional extra: pip install 'pcgopt[jax]'"
        ) from None
    return jax


def _tables(program: ReductionProgram) -> list[dict[str, Any]]:
    """Per step: the mesh axes, and per synthesis rank the rows sent (``src``), where the
    result goes (``dst``), whether the device keeps it and whether it is the group's root."""
    counts = program.counts
    k = math.prod(counts)
    state = list(initial_state(k))
    steps = []
    for step in program.steps:
        sgroups = step.groups(counts)
        axes = tuple(f"s{i}" for i in step.varied(len(counts)))
        src: list[list[int] | None] = [None] * k
        dst: list[list[int] | None] = [None] * k
        keep, root = [False] * k, [False] * k
        for g in sgroups:
            before = [state[r] for r in g]
            after = apply_collective(step.collective, before)
            rows = [chunk_list(s) for s in before]
            for i, r in enumerate(g):
                root[r] = i == 0
                if step.collective == "Broadcast":
                    src[r] = dst[r] = rows[0]
                    keep[r] = True
                elif step.collective == "AllGather":
                    src[r] = rows[i]
                    dst[r] = [row for member in rows for row in member]
                    keep[r] = True
                elif step.collective == "ReduceScatter":
                    block = len(rows[i]) // len(g)
                    src[r] = rows[i]
                    dst[r] = rows[i][i * block : (i + 1) * block]
                    keep[r] = True
                else:  # AllReduce, Reduce
                    src[r] = dst[r] = rows[i]
                    keep[r] = step.collective == "AllReduce" or i == 0
            for r, s in zip(g, after, strict=True):
                state[r] = s
        sizes = {(len(s), len(d)) for s, d in zip(src, dst, strict=True) if s is not None}
        if len(sizes) != 1:
            raise ReductionError(
                f"{program!r}: step {step!r} moves different amounts in different groups; "
                "it has no single-shape lowering"
            )
        ((n_src, n_dst),) = sizes
        # Devices outside every group (a Master step) run the collective too, on rows of the
        # right count; they do not keep the result.
        for r in range(k):
            if src[r] is None:
                src[r], dst[r] = list(range(n_src)), list(range(n_dst))
        steps.append(
            {
                "collective": step.collective,
                "axes": axes,
                "src": np.array(src, dtype=np.int32),
                "dst": np.array(dst, dtype=np.int32),
                "keep": np.array(keep),
                "root": np.array(root),
            }
        )
    return steps


def _mesh(program: ReductionProgram, devices: Sequence[Any] | None) -> tuple[Any, list[int]]:
    jax = _jax()
    counts = program.counts
    k = math.prod(counts)
    total = math.prod(program.hierarchy)
    available = list(devices) if devices is not None else jax.devices()
    if len(available) < total:
        raise ReductionError(
            f"the program runs on {total} devices; JAX has {len(available)} (on a CPU, set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={total} before importing jax)"
        )
    order = [g[r] for g in program.groups for r in range(k)]  # machine device at mesh position
    grid = np.array([available[d] for d in order], dtype=object).reshape(
        (len(program.groups), *counts)
    )
    names = ("g", *(f"s{i}" for i in range(1, len(counts) + 1)))
    return jax.sharding.Mesh(grid, names), order


def _shard_map(jax: Any) -> Any:
    shard_map = getattr(jax, "shard_map", None)
    if shard_map is None:  # JAX before 0.6 kept it in experimental
        from jax.experimental.shard_map import shard_map
    return shard_map


def _per_position(values: np.ndarray, order: list[int], program: ReductionProgram) -> np.ndarray:
    return values[order].reshape((len(program.groups), *program.counts, *values.shape[1:]))


def run_program(
    program: ReductionProgram, values: np.ndarray, *, devices: Sequence[Any] | None = None
) -> np.ndarray:
    """Runs ``program`` with JAX collectives on ``values`` (one row per machine device, its
    length divisible by the size of a reduction group) and returns every device's result in
    the same layout. JAX must have at least as many devices as the program's machine."""
    jax = _jax()
    jnp, lax, P = jax.numpy, jax.lax, jax.sharding.PartitionSpec
    values = np.asarray(values)
    total = math.prod(program.hierarchy)
    counts = program.counts
    k = math.prod(counts) if counts else 1
    if values.ndim != 2 or values.shape[0] != total or values.shape[1] % k:
        raise ReductionError(
            f"values must be (devices={total}, n) with n divisible by {k}; got {values.shape}"
        )
    if not program.steps:
        return values.copy()
    mesh, order = _mesh(program, devices)
    steps = _tables(program)
    chunk = values.shape[1] // k
    spec = P(*mesh.axis_names)
    inst = len(program.groups)

    def tiled(table: np.ndarray) -> np.ndarray:  # per synthesis rank -> per mesh position
        return np.broadcast_to(table, (inst, *table.shape)).reshape(
            (inst, *counts, *table.shape[1:])
        )

    tables = [tuple(tiled(s[name]) for name in ("src", "dst", "keep", "root")) for s in steps]

    def body(x: Any, *flat: Any) -> Any:
        buf = x.reshape(k, chunk)
        for i, s in enumerate(steps):
            src, dst, keep, root = (
                t.reshape(t.shape[len(counts) + 1 :]) for t in flat[4 * i : 4 * i + 4]
            )
            sent = buf[src]
            op = s["collective"]
            if op in ("AllReduce", "Reduce"):
                got = lax.psum(sent, s["axes"])
            elif op == "ReduceScatter":
                got = lax.psum_scatter(sent, s["axes"], scatter_dimension=0, tiled=True)
            elif op == "AllGather":
                got = lax.all_gather(sent, s["axes"], axis=0, tiled=True)
            else:  # Broadcast: only the root contributes
                got = lax.psum(jnp.where(root, sent, jnp.zeros_like(sent)), s["axes"])
            buf = jnp.where(keep, buf.at[dst].set(got), buf)
        return buf.reshape(x.shape)

    mapped = _shard_map(jax)(
        body,
        mesh=mesh,
        in_specs=(spec, *(spec for _ in range(4 * len(steps)))),
        out_specs=spec,
    )
    flat_tables = [t for group in tables for t in group]
    out = np.asarray(jax.jit(mapped)(_per_position(values, order, program), *flat_tables))
    result = np.empty_like(values)
    result[order] = out.reshape(total, -1)
    return result


def run_allreduce(
    program: ReductionProgram, values: np.ndarray, *, devices: Sequence[Any] | None = None
) -> np.ndarray:
    """A plain AllReduce (one ``lax.psum``) within the reduction groups of ``program``, on the
    same mesh: what every program must compute."""
    jax = _jax()
    values = np.asarray(values)
    if not program.steps:
        return values.copy()
    mesh, order = _mesh(program, devices)
    spec = jax.sharding.PartitionSpec(*mesh.axis_names)
    reduce_axes = mesh.axis_names[1:]
    mapped = _shard_map(jax)(
        lambda x: jax.lax.psum(x, reduce_axes), mesh=mesh, in_specs=(spec,), out_specs=spec
    )
    out = np.asarray(jax.jit(mapped)(_per_position(values, order, program)))
    result = np.empty_like(values)
    result[order] = out.reshape(math.prod(program.hierarchy), -1)
    return result
