"""The rule language: parsing, printing, checking, rule files, and evaluating sides."""

import numpy as np
import pytest

from pcgopt.rewrite import (
    Instance,
    Prod,
    Rule,
    RuleError,
    SizeOf,
    Sym,
    TensorDecl,
    Term,
    Var,
    dump_rules,
    evaluate_side,
    infer_side,
    load_rules,
    parse_expr,
)
from pcgopt.shapes import ParallelTensorShape
from pcgopt.sharded import ShardedArray


@pytest.mark.parametrize(
    "text",
    [
        "relu(partition(x, dim=0, degree=k))",
        "split(concat(x, y, axis=1), axis=1, sizes=(size(x, 1), size(y, 1)))",
        "partition(x, dim=0, degree=k*j)",
        "linear(x, w, b, activation='relu')",
        "(relu(x), add(x, y))",
        "split(x, axis=0, sizes=(s + t, 2))[1]",
    ],
)
def test_printing_reads_back(text):
    exprs = parse_expr(text)
    from pcgopt.rewrite import format_exprs

    assert parse_expr(format_exprs(exprs)) == exprs


def test_parsed_structure():
    (e,) = parse_expr("partition(x, dim=0, degree=k*j)")
    assert e == Term("partition", (Var("x"),), {"dim": 0, "degree": Prod((Sym("k"), Sym("j")))})
    (first, second) = parse_expr("split(x, axis=0, sizes=(size(x, 0), 2))")
    assert (first.index, second.index) == (0, 1)
    assert first.params["sizes"][0] == SizeOf("x", 0)


@pytest.mark.parametrize(
    ("lhs", "rhs", "inputs", "message"),
    [
        ("frob(x)", "x", {"x": "[m]"}, "unknown operator 'frob'"),
        ("relu(x, x)", "x", {"x": "[m]"}, "relu takes 1 input"),
        (
            "relu(x)",
            "relu(y)",
            {"x": "[m]", "y": "[m]"},
            r"right side uses \[.y.\], which the left",
        ),
        ("relu(x)", "x", {}, "not declared"),
        ("relu(x)", "(x, x)", {"x": "[m]"}, "1 left output"),
        ("input(x)", "x", {"x": "[m]"}, "cannot appear in a rule"),
        ("relu(x, alpha=1)", "x", {"x": "[m]"}, "no parameter"),
        ("relu(x", "x", {"x": "[m]"}, "cannot parse"),
    ],
)
def test_malformed_rules(lhs, rhs, inputs, message):
    with pytest.raises(RuleError, match=message):
        Rule.parse("r", lhs, rhs, inputs)


def test_declarations():
    d = TensorDecl.parse("i64[b, 1, l]")
    assert d.rank == 3 and d.sizes({"b": 4, "l": 7}) == (4, 1, 7) and repr(d) == "i64[b, 1, l]"
    with pytest.raises(RuleError, match="neither a letter nor a size"):
        TensorDecl.parse("[m, -1]")
    with pytest.raises(RuleError, match="neither a letter nor a size"):
        TensorDecl.parse("[m, 0]")


def test_rule_files_round_trip():
    rules = [
        Rule.parse(
            "a",
            "relu(partition(x, dim=0, degree=k))",
            "partition(relu(x), dim=0, degree=k)",
            {"x": "[m, n]"},
            {"m": 4, "n": 6},
        ),
        Rule.parse("b", "add(x, y)", "add(y, x)", {"x": "[m, n]", "y": "[m, n]"}),
    ]
    text = dump_rules(rules, {"a": {"verdict": "proved"}})
    assert text.count("\n") == 4  # one rule per line
    loaded = load_rules(text)
    assert [r for r, _ in loaded] == rules
    assert loaded[0][1] == {"verdict": "proved"}


def test_sides_evaluate_on_sharded_values():
    rule = Rule.parse(
        "mm",
        "matmul(x, w)",
        "reduce(matmul(partition(x, dim=1, degree=k), partition(w, dim=0, degree=k)), degree=k)",
        {"x": "[m, n]", "w": "[n, p]"},
    )
    inst = Instance(
        {"x": ParallelTensorShape.of((2, 4)), "w": ParallelTensorShape.of((4, 3))}, {"k": 2}
    )
    assert infer_side(rule.lhs, inst) == infer_side(rule.rhs, inst)
    rng = np.random.default_rng(0)
    values = {
        k: ShardedArray.from_logical(rng.standard_normal(s.sizes), s)
        for k, s in inst.shapes.items()
    }
    (a,), (b,) = evaluate_side(rule.lhs, inst, values), evaluate_side(rule.rhs, inst, values)
    np.testing.assert_allclose(a.logical(), b.logical())


def test_hashed_values_can_cross_processes(tmp_path):
    # Params, Term and PCG cache their hash, which is of strings and so differs between
    # processes; a pickle (to a worker, or in a cache file) must not carry it, or an equal value
    # built in the other process misses it in every dict.
    import pickle
    import subprocess
    import sys

    from pcgopt.models import mnist_mlp

    term = Term("partition", (Term("relu", (Var("x1"),)),), {"dim": 0, "degree": 2})
    path = tmp_path / "values.pkl"
    path.write_bytes(pickle.dumps((term, mnist_mlp())))
    script = (
        "import pickle, sys\n"
        "from pcgopt.models import mnist_mlp\n"
        "from pcgopt.rewrite import Term, Var\n"
        "term, pcg = pickle.loads(open(sys.argv[1], 'rb').read())\n"
        "fresh = Term('partition', (Term('relu', (Var('x1'),)),), {'dim': 0, 'degree': 2})\n"
        "print(fresh in {term}, fresh.params in {term.params}, mnist_mlp() in {pcg})\n"
    )
    env = {**__import__("os").environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", script, str(path)], capture_output=True, text=True, env=env
    )
    assert out.stdout.split() == ["True", "True", "True"], out.stderr
