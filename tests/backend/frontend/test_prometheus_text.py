"""The client-side metrics parser's worked examples."""
import doctest

from backend.frontend import prometheus_text


def test_docstring_examples():
    assert doctest.testmod(prometheus_text).failed == 0
