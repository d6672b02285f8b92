from backend.generation.stopping import find_stop, holdback


def test_find_stop_earliest():
    assert find_stop("abc END xyz STOP", ["STOP", "END"]) == 4
    assert find_stop("abc", ["x"]) is None


def test_holdback():
    assert holdback("Hello\nUs", ["\nUser:"]) == 3
    assert holdback("Hello", ["\nUser:"]) == 0
