"""The public strategies produce what they promise."""

from hypothesis import find, given

from pcgopt import PCG, OpKind
from pcgopt.testing.strategies import parallel_shapes, small_pcgs


@given(small_pcgs())
def test_small_pcgs_are_valid(pcg):
    assert isinstance(pcg, PCG)
    assert PCG(pcg.nodes, pcg.outputs) == pcg


def test_small_pcgs_reach_parallel_and_partial_tensors():
    has_parallel = find(small_pcgs(), lambda g: len(g.nodes_of_kind(OpKind.PARALLEL)) >= 2)
    assert len(has_parallel.nodes_of_kind(OpKind.PARALLEL)) >= 2
    partial = find(
        small_pcgs(max_ops=10), lambda g: any(g.shape(n.name).is_partial for n in g.nodes)
    )
    assert any(partial.shape(n.name).is_partial for n in partial.nodes)


@given(parallel_shapes())
def test_parallel_shapes_are_consistent(shape):
    assert shape.num_shards == shape.replica_degree * __import__("math").prod(shape.degrees)
