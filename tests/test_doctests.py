"""The examples in the docstrings of the architecture's folders (egraph/, rules/, verify/,
extract/) run and print what they say. pytest's --doctest-modules collects those of pcgopt/ only:
the other folders install as subpackages of pcgopt, so they are imported here by that name."""

import doctest
import importlib
import pkgutil

import pytest

PACKAGES = ("pcgopt.egraph", "pcgopt.rules", "pcgopt.verify", "pcgopt.extract")


def _modules(package: str) -> list[str]:
    pkg = importlib.import_module(package)
    names = [package]
    for info in pkgutil.walk_packages(pkg.__path__, prefix=package + "."):
        if not info.name.endswith("__main__"):
            names.append(info.name)
    return names


def _examples(module_name: str) -> list[doctest.DocTest]:
    module = importlib.import_module(module_name)
    return [t for t in doctest.DocTestFinder().find(module, module_name) if t.examples]


MODULES = [name for package in PACKAGES for name in _modules(package)]


@pytest.mark.parametrize("module_name", [m for m in MODULES if _examples(m)])
def test_docstring_examples_run(module_name):
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    failures = []
    for test in _examples(module_name):
        result = runner.run(test, out=failures.append)
        assert result.attempted == len(test.examples)
    assert not failures, "".join(failures)


def test_the_folders_have_examples_to_run():
    # A collection that silently found nothing would pass the test above vacuously.
    assert sum(len(_examples(m)) for m in MODULES) >= 10
