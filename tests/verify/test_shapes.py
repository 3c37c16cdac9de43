"""The symbolic shape model agrees with the concrete engine: for every compute operator and
random input distributions, Z3 finds the same well-formedness and the same output shapes."""

import pytest
import z3
from hypothesis import given, settings
from hypothesis import strategies as st

from pcgopt import OPERATORS, PCGError
from pcgopt.ops import ComputeOp
from pcgopt.rewrite import Term, Var
from pcgopt.shapes import ParallelTensorShape
from pcgopt.testing.strategies import COMPUTE_OPS, op_instances, parallelizations
from pcgopt.verify.shapes import new_model, side


def symbolic(instance, shapes):
    """(satisfiable?, output shapes) of the symbolic model with the inputs fixed to ``shapes``."""
    names = [f"x{i}" for i in range(len(shapes))]
    spec = instance.spec
    n_out = spec.num_outputs(instance.params)
    terms = tuple(
        Term(instance.op, tuple(Var(n) for n in names), instance.params, i) for i in range(n_out)
    )
    m = new_model(
        {n: s.sizes for n, s in zip(names, shapes, strict=True)},
        [],
        {n: s.dtype for n, s in zip(names, shapes, strict=True)},
    )
    outs, valid = side(m, terms, {}, sizes=True)
    s = z3.Solver()
    s.add(m.positive + valid)
    for n, shape in zip(names, shapes, strict=True):
        x = m.inputs[n]
        s.add([d == v for d, v in zip(x.degrees, shape.degrees, strict=True)])
        s.add(x.copies == shape.copy_degree, x.partial == shape.sum_degree)
    if s.check() != z3.sat:
        return False, None
    model = s.model()
    return True, tuple(o.concrete(model) for o in outs)


def concrete(instance, shapes):
    try:
        return True, instance.spec.infer(instance.params, shapes)
    except PCGError:
        return False, None


#: Operators whose structure depends on sizes are modelled symbolically only where they say
#: which size relations keep it (a reshape); the others are Unsupported (a conv).
MODELLED = [
    op
    for op in COMPUTE_OPS
    if not OPERATORS[op].size_dependent_signature
    or type(OPERATORS[op]).signature_conditions is not ComputeOp.signature_conditions
]


def test_reshape_is_modelled_and_conv_is_not():
    assert "reshape" in MODELLED
    assert "conv2d" not in MODELLED


@st.composite
def any_distribution(draw, shape: ParallelTensorShape):
    degs = [draw(st.sampled_from([d for d in (1, 2, 3, 4) if n % d == 0])) for n in shape.sizes]
    return ParallelTensorShape.of(
        shape.sizes,
        shape.dtype,
        degrees=degs,
        copy_degree=draw(st.integers(1, 4)),
        sum_degree=draw(st.integers(1, 3)),
    )


@pytest.mark.parametrize("op", MODELLED)
@settings(max_examples=20)  # per operator: 42 operators, each example a Z3 check
@given(data=st.data())
def test_symbolic_model_accepts_legal_distributions_with_the_same_outputs(op, data):
    instance = data.draw(op_instances([op]))
    shapes = data.draw(parallelizations(instance))
    assert symbolic(instance, shapes) == concrete(instance, shapes)


@pytest.mark.parametrize("op", MODELLED)
@settings(max_examples=20)  # per operator: 42 operators, each example a Z3 check
@given(data=st.data())
def test_symbolic_model_agrees_on_arbitrary_distributions(op, data):
    instance = data.draw(op_instances([op]))
    shapes = tuple(data.draw(any_distribution(s)) for s in instance.inputs)
    assert symbolic(instance, shapes) == concrete(instance, shapes)
