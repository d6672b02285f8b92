"""Every worked example in the policy docstrings is a test."""
import doctest
import importlib
import pkgutil

import pytest

import policy

MODULES = [m.name for m in pkgutil.iter_modules(policy.__path__)]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    mod = importlib.import_module(f"policy.{name}")
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
