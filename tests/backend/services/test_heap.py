"""heap.freeze_startup_objects: what is alive at the call leaves the cyclic collector's walks;
garbage made later is still collected."""
import gc

from backend.services.heap import freeze_startup_objects


def test_start_up_objects_are_frozen_and_later_garbage_still_collected():
    try:
        kept = [[i] for i in range(1000)]  # alive at the freeze
        frozen = freeze_startup_objects()
        # the count it returns is the permanent generation's at the freeze; threads left by earlier tests
        # may free frozen objects right after (a suite run saw 525,441 then 525,439), so no equality
        assert frozen >= len(kept) and gc.get_freeze_count() >= len(kept)
        walked = {id(x) for g in range(3) for x in gc.get_objects(generation=g)}
        assert not any(id(x) in walked for x in kept)  # in no generation the collector walks
        cycle = []
        cycle.append(cycle)  # garbage made after the freeze: the collector still finds it
        del cycle
        assert gc.collect() >= 1
    finally:
        gc.unfreeze()
