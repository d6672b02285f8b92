"""Before its first step the loop's thread has the engine commit its peak memory, on the thread
that will drive it (a llama.cpp decode from another thread slows every later step): engines that
have a `warm_up` (backend/engines/llama_cpp.py) run it; a failure is logged and serving goes on."""
import logging

log = logging.getLogger("specserve")


def warm_up(engine) -> None:
    run = getattr(engine, "warm_up", None)
    if run is None:
        return
    try:
        run()
    except Exception:
        log.exception("engine warm-up failed; serving without it")
