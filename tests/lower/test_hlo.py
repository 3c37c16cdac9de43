"""Collectives read from compiled HLO text: kinds, groups, bytes, scopes."""

import pytest

from pcgopt.lower.hlo import collective_bytes, compiled_collectives

MESH = "replica_groups=mesh['a'=2,'b'=2,'c'=2]"


def _one(line: str):
    (c,) = compiled_collectives(line)
    return c


def test_an_all_gather_over_two_mesh_axes():
    c = _one(
        f"%ag = f32[16,4]{{1,0}} all-gather(%x), channel_id=1, {MESH} {{'b','c'}}, "
        'dimensions={0}, metadata={op_name="jit(step)/jvp()/shard_map/layer0.q/all_gather"}'
    )
    assert (c.kind, c.group_size, c.groups, c.axes) == ("all-gather", 4, 2, ("b", "c"))
    assert c.nbytes == 16 * 4 * 4
    assert c.bytes == 3 * 256 * 2  # (p-1) n per group, 2 groups
    assert (c.scope, c.phase) == ("layer0.q", "forward")


def test_a_reduce_scatter_counts_its_input():
    c = _one(
        f"%rs = f32[16,2]{{0,1}} reduce-scatter(%x), {MESH} {{'a'}}, dimensions={{1}}, "
        'to_apply=%add, metadata={op_name="jit(step)/transpose(jvp())/shard_map/n/psum_scatter"}'
    )
    assert c.nbytes == 16 * 2 * 4 * 2  # the input: two results
    assert c.bytes == collective_bytes("reduce-scatter", 2, c.nbytes) * 4
    assert c.phase == "backward"


def test_a_combined_all_reduce_is_one_collective_per_operand():
    found = compiled_collectives(
        "%ar = (f32[784,512]{1,0}, f32[512,10]{1,0}) all-reduce(%a, %b), channel_id=1, "
        "replica_groups=mesh['d'=2] {'d'}, to_apply=%add, "
        'metadata={op_name="jit(step)/transpose(jvp())/shard_map/psum"}'
    )
    assert [(c.shape, c.bytes, c.combined) for c in found] == [
        ("f32[784,512]", 2 * 784 * 512 * 4, 2),
        ("f32[512,10]", 2 * 512 * 10 * 4, 2),
    ]
    assert all(c.scope == "" for c in found)  # a weight gradient's sum, at the boundary


def test_a_tuple_all_to_all_is_one_buffer():
    c = _one(
        "%a2a = (f32[8,2]{1,0}, f32[8,2]{1,0}) all-to-all(%p, %q), channel_id=1, "
        f"{MESH} {{'c'}}"
    )
    assert (c.nbytes, c.group_size, c.groups) == (2 * 8 * 2 * 4, 2, 4)


def test_listed_and_iota_groups_and_permutes():
    listed = _one("%x = f32[4]{0} all-reduce(%y), replica_groups={{0,1},{2,3}}, to_apply=%add")
    assert (listed.group_size, listed.groups, listed.axes) == (2, 2, ())
    iota = _one("%x = bf16[4]{0} all-gather(%y), replica_groups=[2,4]<=[8], dimensions={0}")
    assert (iota.group_size, iota.groups, iota.nbytes) == (4, 2, 8)
    permute = _one("%x = f32[3]{0} collective-permute(%y), source_target_pairs={{0,1},{1,0}}")
    assert permute.bytes == 2 * 12


def test_scopes_inside_vjp_and_merged_names():
    c = _one(
        f"%ag = f32[4]{{0}} all-gather(%x), {MESH} {{'a'}}, dimensions={{0}}, "
        'metadata={op_name="jit(step)/shard_map/transpose(jvp(layer1.k.gather2))/all_gather:'
        'transpose(jvp())/shard_map/other/all_gather"}'
    )
    assert (c.scope, c.phase) == ("layer1.k.gather2", "backward")


def test_lines_that_are_not_collectives_are_ignored():
    assert compiled_collectives("%add = f32[4]{0} add(%a, %b)\n%all-gather-done = x") == ()
    with pytest.raises(ValueError, match="unknown collective"):
        collective_bytes("all-sum", 2, 8)


def test_listed_and_iota_groups_are_kept_as_members():
    listed = _one("%ar = f32[4]{0} all-reduce(%x), replica_groups={{0,2},{1,3}}, to_apply=%add")
    assert (listed.group_size, listed.groups) == (2, 2)
    assert listed.members == ((0, 2), (1, 3))
    iota = _one("%ar = f32[4]{0} all-reduce(%x), replica_groups=[2,4]<=[8], to_apply=%add")
    assert iota.members == ((0, 1, 2, 3), (4, 5, 6, 7))
    # [2,4]<=[4,2]T(1,0): iota(8) as 4x2, transposed to 2x4, read in rows.
    transposed = _one(
        "%ar = f32[4]{0} all-reduce(%x), replica_groups=[2,4]<=[4,2]T(1,0), to_apply=%add"
    )
    assert transposed.members == ((0, 2, 4, 6), (1, 3, 5, 7))
    assert _one(f"%ar = f32[4]{{0}} all-reduce(%x), {MESH} {{'a'}}, to_apply=%add").members == ()
