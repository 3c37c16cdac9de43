"""Enumerating small PCGs and fingerprinting them (TASO's method, with parallel operators).

Every graph of up to ``max_ops`` operators over a fixed set of concrete input tensors is built
depth-first. Each operator is one *variant* (an operator with concrete parameters, e.g.
``partition(dim=1, degree=2)``) applied to tensors already in the graph. Pruning while
enumerating:

* no two identical operators (same variant, same inputs);
* inputs of one class (data, weights, partial sums) are used in order: ``x2`` only with
  ``x1``, so graphs that differ by renaming inputs are mostly built once. A rule needs its two
  sides under one naming, so after the search each graph is also fingerprinted with its inputs
  renamed (within a class); those renamed graphs pair with built ones, never with each other;
* independent operators are added in one canonical order (an operator that does not read the
  previous one's output must come after it in variant order);
* one input order for commutative operators (the swap is a rule of its own);
* no duplicate tensors: a new tensor equal to one the graph already has is not kept, and the
  pair becomes an identity candidate (``combine(partition(x)) = x``).

A graph's fingerprint hashes, for each of its outputs (tensors nothing in the graph reads), the
parallel shape and the exact value (integer arithmetic) of the tensor it stands for.
Graphs with equal fingerprints are candidate rules (:mod:`pcgopt.rules.candidates`).

The work splits into independent shards, one per first operator, so that a run can be spread
over processes (or machines) and resumed shard by shard.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from pcgopt.errors import PCGError
from pcgopt.ops import ParallelOp, StackPartial, get_op
from pcgopt.rewrite import Expr, Instance, Term, Var, rename_vars, walk
from pcgopt.shapes import ParallelTensorShape
from pcgopt.sharded import ShardedArray


@dataclass(frozen=True)
class Variant:
    """An operator with concrete parameters, as the enumerator applies it."""

    op: str
    params: tuple[tuple[str, object], ...] = ()
    #: How many inputs it reads, where the operator has optional ones (``linear`` with its
    #: bias: 3); default the required ones (2 for variadic operators).
    inputs: int | None = None

    @property
    def arity(self) -> int:
        if self.inputs is not None:
            return self.inputs
        return get_op(self.op).min_inputs if not get_op(self.op).variadic else 2

    def __repr__(self) -> str:
        ps = ", ".join(f"{k}={v!r}" for k, v in self.params)
        extra = f", inputs={self.inputs}" if self.inputs is not None else ""
        return f"{self.op}({ps}{extra})"


@dataclass(frozen=True)
class InputSpec:
    """A concrete input tensor: its name, class (for canonical order), and parallel shape."""

    name: str
    cls: str
    shape: ParallelTensorShape


@dataclass(frozen=True)
class Config:
    """What to enumerate. The defaults follow the generator behind FlexFlow's rule file: data
    tensors of shape [2, 4], square [4, 4] weights, degree 2; plus partial-sum inputs, without
    which rules about reducing partial sums would need more operators than ``max_ops``."""

    max_ops: int = 3
    degree: int = 2
    ops: tuple[str, ...] = (
        "relu",
        "transpose",
        "add",
        "mul",
        "matmul",
        "linear",
        "concat",
        "split",
        "partition",
        "combine",
        "replicate",
        "reduce",
        "stack_partial",
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "discard_copies",
        "to_partial",
    )
    inputs: tuple[InputSpec, ...] = (
        InputSpec("x1", "data", ParallelTensorShape.of((2, 4))),
        InputSpec("x2", "data", ParallelTensorShape.of((2, 4))),
        InputSpec("x3", "data", ParallelTensorShape.of((2, 4))),
        InputSpec("w1", "weight", ParallelTensorShape.of((4, 4))),
        InputSpec("w2", "weight", ParallelTensorShape.of((4, 4))),
        InputSpec("p1", "partial", ParallelTensorShape.of((2, 4), sum_degree=2)),
        InputSpec("p2", "partial", ParallelTensorShape.of((2, 4), sum_degree=2)),
    )
    seed: int = 0
    #: At most this many outputs (tensors nothing reads) per graph.
    max_outputs: int = 2
    #: Candidate rules with more operators than this on both sides together are not
    #: considered (None: all). Families whose operators read three tensors need ``max_ops=4``
    #: for one side of a rule (``linear(partition(x), replicate(w), replicate(b))``); their
    #: 4-against-4 candidates are many and rarely new.
    max_rule_ops: int | None = None
    #: Enumerate only one-operator graphs ``P(op(P1(x1), ..., Pn(xn)))``: one computing
    #: operator, at most one parallel operator on each of its inputs and at most one on its
    #: output (``max_ops`` is not used). These are the graphs whose pairs are the operator's
    #: parallelization rules (``layer_norm(partition(x, dim=0), replicate(g), replicate(b)) =
    #: partition(layer_norm(x, g, b), dim=0)``); the full enumeration of three-input operators
    #: at four operators does not finish on a laptop, and its other graphs give nothing new
    #: for such an operator.
    one_op: bool = False
    #: The parallel operators split, gather and scatter the axes of tensors of this rank
    #: (None: the highest rank of the data inputs, else 2). An embedding's ids are [B, S] and
    #: its output [B, S, H]: 3 lets its hidden dimension be split.
    split_rank: int | None = None
    #: A second degree ``j`` (lifted to the symbol ``j``, and ``degree * j`` to ``k*j``): the
    #: parallel operators are enumerated at ``degree``, at ``j`` and at their product, and only
    #: rules relating two degrees are kept (``replicate(replicate(x, degree=k), degree=j) =
    #: replicate(x, degree=k*j)``). A plan that is data-parallel across nodes and
    #: tensor-parallel within each composes two degrees; rules of one degree cannot relate
    #: the orders in which a plan and the e-graph compose them. None: one degree.
    second_degree: int | None = None
    #: A one-operator family's rules are the two-level splits its proved one-level splits
    #: compose into (:mod:`pcgopt.rules.nesting`), verified again, and not those one-level
    #: splits themselves (the full enumeration proves or derives them).
    nested: bool = False

    def __post_init__(self) -> None:
        j = self.second_degree
        if self.nested and not self.one_op:
            raise ValueError("Config.nested composes a one-operator family's splits: set one_op")
        if j is not None and (j < 2 or math.gcd(j, self.degree) != 1):
            # Coprime degrees keep k, j and k*j apart in the lift (2 and 4 would read 4 as j
            # or as k*k).
            raise ValueError(
                f"Config.second_degree must be at least 2 and coprime to degree "
                f"{self.degree}, got {j!r}"
            )

    def degrees(self) -> tuple[int, ...]:
        """The degrees the parallel operators are enumerated at."""
        if self.second_degree is None:
            return (self.degree,)
        return (self.degree, self.second_degree, self.degree * self.second_degree)

    def variants(self) -> list[Variant]:
        """The operator variants, in a fixed order."""
        ks = self.degrees()
        # Axes of the data tensors: (0, 1) for the default matrices, (0, 1, 2) for 3-D
        # activations (a transformer's [batch, sequence, hidden]).
        data_rank = max((s.shape.rank for s in self.inputs if s.cls == "data"), default=2)
        axes = tuple(range(self.split_rank or data_rank))
        last = axes[-1]
        table = {
            "relu": [Variant("relu")],
            "gelu": [Variant("gelu")],
            "transpose": [Variant("transpose", (("perm", (1, 0)),))],
            # Attention's head transposes: [B, S, h, d] -> [B, h, S, d] and -> [B, h, d, S].
            "transpose_heads": [
                Variant("transpose", (("perm", p),)) for p in ((0, 2, 1, 3), (0, 2, 3, 1))
            ],
            # The last dimension into (2, rest) heads, and two last dimensions merged back.
            "reshape_heads": [
                Variant("reshape", (("shape", "heads"),)),
                Variant("reshape", (("shape", "merge"),)),
            ],
            "reshape_split": [Variant("reshape", (("shape", "heads"),))],
            "reshape_merge": [Variant("reshape", (("shape", "merge"),))],
            "scale": [Variant("scale", (("factor", 0.5),))],
            "add": [Variant("add")],
            "mul": [Variant("mul")],
            "matmul": [Variant("matmul")],
            "batch_matmul": [Variant("batch_matmul")],
            "linear": [Variant("linear", (("activation", a),)) for a in ("none", "relu")],
            # The activations the matrix enumeration leaves out (a one-operator family).
            "linear_smooth": [
                Variant("linear", (("activation", a),)) for a in ("gelu", "sigmoid", "tanh")
            ],
            "linear_plain": [Variant("linear", (("activation", "none"),))],
            "linear_bias": [
                Variant("linear", (("activation", a),), inputs=3) for a in ("none", "gelu")
            ],
            "softmax": [Variant("softmax", (("axis", last),))],
            "layer_norm": [Variant("layer_norm", inputs=3)],
            # Rate one half: the kept integers double and stay integers.
            "dropout": [Variant("dropout", (("rate", 0.5),))],
            "embedding": [Variant("embedding")],
            "embedding_bag": [Variant("embedding_bag")],
            "concat": [Variant("concat", (("axis", a),)) for a in axes],
            "split": [Variant("split", (("axis", a), ("sizes", "concat"))) for a in axes],
            "partition": [
                Variant("partition", (("dim", d), ("degree", k))) for k in ks for d in axes
            ],
            "combine": [Variant("combine", (("dim", d), ("degree", k))) for k in ks for d in axes],
            "replicate": [Variant("replicate", (("degree", k),)) for k in ks],
            "reduce": [Variant("reduce", (("degree", k),)) for k in ks],
            "stack_partial": [Variant("stack_partial")],
            "all_reduce": [Variant("all_reduce", (("degree", k),)) for k in ks],
            "all_gather": [
                Variant("all_gather", (("dim", d), ("degree", k))) for k in ks for d in axes
            ],
            "reduce_scatter": [
                Variant("reduce_scatter", (("dim", d), ("degree", k))) for k in ks for d in axes
            ],
            "discard_copies": [Variant("discard_copies", (("degree", k),)) for k in ks],
            "to_partial": [Variant("to_partial", (("degree", k),)) for k in ks],
            "pipeline": [
                Variant("pipeline", (("dim", d), ("micro_batches", k))) for k in ks for d in axes
            ],
            "batch": [
                Variant("batch", (("dim", d), ("micro_batches", k))) for k in ks for d in axes
            ],
        }
        unknown = sorted(set(self.ops) - set(table))
        if unknown:
            raise ValueError(f"no enumeration variants for {unknown}; known: {sorted(table)}")
        return [v for op in self.ops for v in table[op]]


def fingerprint(value: ShardedArray) -> bytes:
    """The parallel shape and the exact value a tensor stands for, hashed."""
    h = hashlib.blake2b(digest_size=12)
    h.update(repr(value.shape).encode())
    logical = value.logical()
    if logical.dtype.kind == "f" and not np.array_equal(logical, np.rint(logical)):
        # softmax, layer_norm and gelu leave integers: hash their values on a 2^-20 grid
        # (equal values computed in another order still agree; a near miss only loses a
        # candidate, and a collision is refuted by the verifier).
        logical = np.rint(logical * 2.0**20)
    logical = np.ascontiguousarray(logical, dtype=np.int64)
    h.update(logical.tobytes())
    return h.digest()


#: Integer inputs (ids) take values below this, so a family's tables need at least this many
#: rows (an out-of-range id is an evaluation error, and the graph is skipped).
INDEX_LIMIT = 4


def input_values(config: Config) -> list[ShardedArray]:
    """Deterministic integer values for the inputs (partial sums split at random); integer
    inputs (ids) are drawn from ``[0, INDEX_LIMIT)``."""
    out = []
    for i, spec in enumerate(config.inputs):
        rng = np.random.default_rng([config.seed, i])
        if spec.shape.dtype.is_integer:
            # An embedding's ids: rows that every table of a family has.
            value = rng.integers(0, INDEX_LIMIT, size=spec.shape.sizes).astype(np.int64)
        else:
            value = rng.integers(-3, 4, size=spec.shape.sizes).astype(np.int64)
        out.append(ShardedArray.from_logical(value, spec.shape, rng))
    return out


@dataclass
class _Node:
    """A tensor in the graph being built."""

    term: Expr
    value: ShardedArray
    fp: bytes
    readers: int = 0


@dataclass(frozen=True)
class GraphRecord:
    """One enumerated graph: its fingerprint and the terms of its outputs (in fingerprint
    order), and the number of operators."""

    key: bytes
    outputs: tuple[Expr, ...]
    ops: int
    #: Not built by the enumeration (whose inputs are used in order) but a renaming of inputs of
    #: a graph that was: it pairs with built graphs, never with another renamed one.
    renamed: bool = False


@dataclass(frozen=True)
class Identity:
    """A new tensor equal to one the graph already had: ``term`` equals ``existing``."""

    term: Expr
    existing: Expr


@dataclass
class ShardResult:
    graphs: list[GraphRecord] = field(default_factory=list)
    identities: list[Identity] = field(default_factory=list)
    visited: int = 0


class Enumerator:
    """Depth-first enumeration (see the module docstring)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.variants = config.variants()
        self._computes = [
            not isinstance(get_op(v.op), ParallelOp | StackPartial) for v in self.variants
        ]
        self.values = input_values(config)
        #: Shapes of the tensors made so far (a term always has the same shape).
        self._shapes: dict[Expr, ParallelTensorShape] = {
            Var(s.name): s.shape for s in config.inputs
        }

    def shards(self) -> int:
        """Shards are the first operator's variant (the computing operator's, ``one_op``)."""
        if self.config.one_op:
            return sum(self._computes)
        return len(self.variants)

    def run(self, shard: int) -> ShardResult:
        result = ShardResult()
        if self.config.one_op:
            self._one_op(shard, result)
            identities, renamed = self._renamings(result.graphs)
            result.identities += identities
            result.graphs += renamed
            return result
        nodes: list[_Node] = []
        used_inputs = [False] * len(self.config.inputs)
        for spec, value in zip(self.config.inputs, self.values, strict=True):
            nodes.append(_Node(Var(spec.name), value, fingerprint(value)))
        self._extend(nodes, used_inputs, [], result, first_variant=shard)
        identities, renamed = self._renamings(result.graphs)
        result.identities += identities
        result.graphs += renamed
        return result

    def _renamings(self, graphs: Sequence[GraphRecord]) -> tuple[list[Identity], list[GraphRecord]]:
        """The graphs ``sigma(G)`` for each graph ``G`` and renaming ``sigma`` of its inputs
        (within a class). The search uses inputs in order, so it never builds ``sigma(G)``; yet
        a rule needs both of its sides under one naming: ``mul(x1, add(x2, x3))`` is only built
        as ``mul(x3, add(x1, x2))``, which does not pair with ``add(mul(x1, x2), mul(x1, x3))``.
        Where ``sigma`` keeps a one-output graph's value, ``sigma(G) = G`` is an identity
        instead (associativity: ``add(x1, add(x2, x3))`` renames ``add(x3, add(x1, x2))``)."""
        from pcgopt.rules.rewriting import Evaluator

        specs = self.config.inputs
        base = {s.name: v for s, v in zip(specs, self.values, strict=True)}
        inst = Instance({s.name: s.shape for s in specs}, {})
        cls = {s.name: s.cls for s in specs}
        order = [s.name for s in specs]
        evaluators: dict[tuple, Evaluator] = {}
        identities: list[Identity] = []
        renamed: list[GraphRecord] = []
        for g in graphs:
            names = sorted(
                {v.name for t in g.outputs for v in walk(t) if isinstance(v, Var)},
                key=order.index,
            )
            for sigma in _class_permutations(names, cls):
                key = tuple(sorted(sigma.items()))
                if key not in evaluators:
                    env = {n: base[sigma.get(n, n)] for n in base}
                    evaluators[key] = Evaluator(inst, env, fingerprint)
                # G read at inputs renamed by sigma is sigma(G) read at the inputs.
                outs = []
                for t in g.outputs:
                    value = evaluators[key].value(t)
                    if value is None:
                        break
                    outs.append((fingerprint(value), rename_vars(t, sigma)))
                else:
                    outs.sort(key=lambda o: o[0])
                    fp = b"".join(o[0] for o in outs)
                    terms = tuple(o[1] for o in outs)
                    if fp != g.key:
                        renamed.append(GraphRecord(fp, terms, g.ops, renamed=True))
                    elif len(g.outputs) == 1 and terms[0] != g.outputs[0]:
                        identities.append(Identity(terms[0], g.outputs[0]))
        return identities, renamed

    # -- the search --------------------------------------------------------------------------

    def _available(self, nodes: list[_Node], used: list[bool], arity: int) -> list[int]:
        """Tensors an operator may read: computed ones, used inputs, and the first ``arity``
        unused inputs of each class (which of them may be read together: _in_order)."""
        n_in = len(self.config.inputs)
        out = []
        fresh: dict[str, int] = {}
        for i, spec in enumerate(self.config.inputs):
            if used[i]:
                out.append(i)
            elif fresh.get(spec.cls, 0) < arity:
                fresh[spec.cls] = fresh.get(spec.cls, 0) + 1
                out.append(i)
        return out + list(range(n_in, len(nodes)))

    def _in_order(self, used: list[bool]) -> bool:
        """Whether the used inputs of each class are its first ones (x2 only with x1), so that
        graphs that differ by renaming inputs are mostly built once."""
        gap: set[str] = set()
        for i, spec in enumerate(self.config.inputs):
            if not used[i]:
                gap.add(spec.cls)
            elif spec.cls in gap:
                return False
        return True

    def _candidate_args(self, variant: Variant, avail: list[int]) -> Iterator[tuple[int, ...]]:
        if variant.arity == 1:
            for a in avail:
                yield (a,)
        elif variant.arity > 2:
            yield from itertools.product(avail, repeat=variant.arity)
        else:
            # One input order for commutative operators; the swap is a rule of its own
            # (swap_candidates).
            pairs = (
                itertools.combinations_with_replacement(avail, 2)
                if get_op(variant.op).commutative
                else itertools.product(avail, repeat=2)
            )
            yield from pairs

    def _extend(
        self,
        nodes,
        used,
        ops: list[tuple[int, tuple[int, ...]]],
        result: ShardResult,
        first_variant: int | None = None,
    ) -> None:
        if len(ops) >= self.config.max_ops:
            return
        last_out = len(nodes) - 1 if ops else None
        variants = [first_variant] if first_variant is not None else range(len(self.variants))
        for vi in variants:
            variant = self.variants[vi]
            avail = self._available(nodes, used, variant.arity)
            for args in self._candidate_args(variant, avail):
                if ops:
                    prev_vi, prev_args = ops[-1]
                    depends = last_out in args
                    if not depends and (vi, args) <= (prev_vi, prev_args):
                        continue  # independent operators only in canonical order
                    if (vi, args) in ops:
                        continue
                new_used = list(used)
                for a in args:
                    if a < len(self.config.inputs):
                        new_used[a] = True
                if not self._in_order(new_used):
                    continue
                made = self._apply(variant, [nodes[a] for a in args])
                if made is None:
                    continue
                result.visited += 1
                duplicate = False
                for out in made:
                    for node in nodes:
                        if node.fp == out.fp:
                            result.identities.append(Identity(out.term, node.term))
                            duplicate = True
                            break
                if duplicate:
                    continue
                for a in args:
                    nodes[a].readers += 1
                nodes.extend(made)
                ops.append((vi, args))
                self._record(nodes, new_used, len(ops), result)
                self._extend(nodes, new_used, ops, result)
                ops.pop()
                del nodes[len(nodes) - len(made) :]
                for a in args:
                    nodes[a].readers -= 1

    def _one_op(self, shard: int, result: ShardResult) -> None:
        """The graphs ``P(op(P1(x1), ..., Pn(xn)))`` of the ``shard``-th computing variant (see
        ``Config.one_op``); each ``P`` is absent or one parallel variant."""
        vi = [i for i, c in enumerate(self._computes) if c][shard]
        variant = self.variants[vi]
        parallel = [v for v, c in zip(self.variants, self._computes, strict=True) if not c]
        inputs = [
            _Node(Var(s.name), v, fingerprint(v))
            for s, v in zip(self.config.inputs, self.values, strict=True)
        ]
        wrapped: dict[tuple[int, int], _Node | None] = {}

        def wrap(a: int, w: int) -> _Node | None:
            if (a, w) not in wrapped:
                made = self._apply(parallel[w], [inputs[a]])
                wrapped[a, w] = made[0] if made else None
            return wrapped[a, w]

        n_in = len(inputs)
        for args in self._candidate_args(
            variant, self._available(inputs, [False] * n_in, variant.arity)
        ):
            if not self._in_order([i in args for i in range(n_in)]):
                continue
            for wraps in itertools.product(range(-1, len(parallel)), repeat=len(args)):
                read = [
                    inputs[a] if w < 0 else wrap(a, w) for a, w in zip(args, wraps, strict=True)
                ]
                if any(r is None for r in read):
                    continue
                made = self._apply(variant, read)  # type: ignore[arg-type]
                if made is None or len(made) != 1:
                    continue
                n_ops = 1 + sum(w >= 0 for w in wraps)
                result.visited += 1
                self._record_one(made[0], n_ops, result)
                for p in parallel:
                    out = self._apply(p, made)
                    if out is not None:
                        result.visited += 1
                        self._record_one(out[0], n_ops + 1, result)

    @staticmethod
    def _record_one(node: _Node, n_ops: int, result: ShardResult) -> None:
        result.graphs.append(GraphRecord(node.fp, (node.term,), n_ops))

    def _apply(self, variant: Variant, args: list[_Node]) -> list[_Node] | None:
        spec = get_op(variant.op)
        raw = dict(variant.params)
        shapes = tuple(a.value.shape for a in args)
        if raw.get("sizes") == "concat":
            # TASO's split: it cuts where the concat that built its input joined.
            made_by = args[0].term
            if not (
                isinstance(made_by, Term)
                and made_by.op == "concat"
                and made_by.params["axis"] == raw["axis"]
            ):
                return None
            raw["sizes"] = tuple(self._shapes[a].sizes[raw["axis"]] for a in made_by.args)
        if raw.get("shape") in ("heads", "merge"):
            sizes = shapes[0].sizes
            if raw["shape"] == "heads":
                if sizes[-1] % 2:
                    return None
                raw["shape"] = (*sizes[:-1], 2, sizes[-1] // 2)
            elif len(sizes) < 2:
                return None
            else:
                raw["shape"] = (*sizes[:-2], sizes[-2] * sizes[-1])
        try:
            params = spec.make_params(raw, shapes)
            outs = spec.infer(params, shapes)
            values = spec.evaluate(params, tuple(a.value for a in args), outs)
        except PCGError:
            return None
        n_out = len(outs)
        terms = [Term(variant.op, tuple(a.term for a in args), params, i) for i in range(n_out)]
        for t, s in zip(terms, outs, strict=True):
            self._shapes[t] = s
        return [_Node(t, v, fingerprint(v)) for t, v in zip(terms, values, strict=True)]

    def _record(
        self, nodes: list[_Node], used: list[bool], n_ops: int, result: ShardResult
    ) -> None:
        n_in = len(self.config.inputs)
        outputs = [n for n in nodes[n_in:] if n.readers == 0]
        if not outputs or len(outputs) > self.config.max_outputs:
            return
        outputs.sort(key=lambda n: n.fp)
        key = b"".join(n.fp for n in outputs)
        result.graphs.append(GraphRecord(key, tuple(n.term for n in outputs), n_ops))


def _class_permutations(names: Sequence[str], cls: dict[str, str]) -> Iterator[dict[str, str]]:
    """Renamings of ``names`` that map each to one of its class, except the identity."""
    groups: dict[str, list[str]] = {}
    for n in names:
        groups.setdefault(cls[n], []).append(n)
    per_class = [
        [dict(zip(g, p, strict=True)) for p in itertools.permutations(g)] for g in groups.values()
    ]
    for combo in itertools.product(*per_class):
        sigma = {k: v for part in combo for k, v in part.items() if k != v}
        if sigma:
            yield sigma


def swap_candidates(config: Config) -> list[tuple[Expr, Expr]]:
    """``op(a, b)`` and ``op(b, a)`` for each commutative operator variant, on the first two
    distinct inputs it accepts: the enumeration builds one order only, so the swap must be a
    rule for the rule set to reach the other."""
    e = Enumerator(config)
    nodes = [
        _Node(Var(s.name), v, fingerprint(v)) for s, v in zip(config.inputs, e.values, strict=True)
    ]
    out = []
    for variant in e.variants:
        if not get_op(variant.op).commutative:
            continue
        for a, b in itertools.combinations(nodes, 2):
            ab, ba = e._apply(variant, [a, b]), e._apply(variant, [b, a])
            if ab and ba and len(ab) == 1:
                out.append((ab[0].term, ba[0].term))
                break
    return out


def run_shards(config: Config, shards: Sequence[int]) -> ShardResult:
    """Several shards, merged (for tests and single-process runs)."""
    e = Enumerator(config)
    total = ShardResult()
    for s in shards:
        r = e.run(s)
        total.graphs += r.graphs
        total.identities += r.identities
        total.visited += r.visited
    return total
