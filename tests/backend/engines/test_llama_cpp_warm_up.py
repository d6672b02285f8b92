"""The llama.cpp engine commits its peak memory before serving (LlamaCpp.warm_up, run by the
engine loop's thread before its first step): after it, the largest decode the engine can run
(n_batch rows of logits) grows the process by nothing, and the logits are what they were.
Without it that decode grows the RSS by ~190 MiB here (llama.cpp's logits buffers), which the
soak test saw as a step mid-service."""
import threading
import time

import pytest
import torch

from backend.engines.llama_cpp import LlamaCpp, served_gguf
from loop_helpers import ListSink, greedy, make_loop

PROMPT = [(13 * i) % 700 + 20 for i in range(24)]


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


@pytest.fixture(scope="module")
def engine(checkpoint):
    eng = LlamaCpp(served_gguf(checkpoint), max_slots=4, max_context=128)  # 4 x 128 = n_batch (512)
    yield eng
    eng.close()


def test_after_warm_up_the_largest_decode_grows_nothing_and_logits_stay(engine):
    before = engine.forward([0], [0], [PROMPT])
    engine.truncate(0, 0)
    engine.warm_up()
    assert [engine.cached_length(s) for s in range(4)] == [0, 0, 0, 0]
    start = rss_mib()
    engine.forward([0, 1, 2, 3], [0] * 4, [[30 + s] * 128 for s in range(4)])  # 512 rows of logits
    assert rss_mib() - start < 24
    for s in range(4):
        engine.truncate(s, 0)
    assert torch.equal(engine.forward([0], [0], [PROMPT]), before)
    engine.truncate(0, 0)


def test_warm_up_refuses_an_engine_holding_cells(engine):
    engine.forward([2], [0], [PROMPT[:4]])
    with pytest.raises(RuntimeError, match="every slot empty"):
        engine.warm_up()
    assert engine.cached_length(2) == 4
    engine.truncate(2, 0)


@pytest.mark.parametrize("fails", [False, True])
def test_the_loop_thread_warms_the_engine_up_before_its_first_step_and_start_waits_for_it(engine, tokenizer, monkeypatch, fails):
    calls = []

    def warm_up():
        calls.append((threading.current_thread().name, engine.cached_length(0)))
        if fails:
            raise RuntimeError("out of memory")

    monkeypatch.setattr(engine, "warm_up", warm_up)
    loop = make_loop(engine, tokenizer, "off", max_batch=4)
    sink = ListSink()
    loop.submit(greedy("Count to five:", 6), sink)  # waits in the inbox until the thread starts
    loop.start()
    assert calls == [("engine-loop", 0)]  # start() returned after the warm-up: a server is ready only then
    deadline = time.time() + 120
    while not sink.done and time.time() < deadline:
        time.sleep(0.05)
    loop.stop()
    assert calls == [("engine-loop", 0)]
    assert sink.done and not sink.errors and sink.chunks[-1].finish_reason in ("stop", "length")
