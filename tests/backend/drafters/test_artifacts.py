"""Where a built model drafter is found: the worked examples of backend/drafters/artifacts.py
(they were build_engines/on_demand.py's before the served configuration moved into backend/)."""
import doctest

from backend.drafters import artifacts


def test_docstring_examples():
    result = doctest.testmod(artifacts)
    assert result.failed == 0 and result.attempted > 0
