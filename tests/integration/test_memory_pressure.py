"""The real server under a KV budget too small for the offered load: every request completes."""
import threading

import pytest

from server_helpers import running_server

# The served llama.cpp engine caches SmolLM2-135M in Q8_0, 12,240 bytes per token: 4 MiB holds
# ~340 tokens (21 blocks of 16), far less than the 8 concurrent chat requests below need
# (~8 x 130 tokens).
TIGHT_ENV = {"SPECSERVE_MAX_BATCH": "8", "SPECSERVE_MAX_CONTEXT": "512", "SPECSERVE_KV_BUDGET_MB": "4",
             "SPECSERVE_DRAFTERS": "ngram,suffix"}


@pytest.fixture(scope="module")
def tight_server(tmp_path_factory, checkpoint):
    with running_server(TIGHT_ENV, tmp_path_factory.mktemp("triton-tight")) as srv:
        yield srv


def test_every_request_completes_under_a_tight_kv_budget(tight_server):
    results = [None] * 8

    def run(i):
        results[i] = tight_server.generate({"text_input": f"Write a list of {i + 5} animals and where they live.",
                                            "max_tokens": 80, "apply_chat_template": True,
                                            "exclude_input_in_output": True}, timeout=600)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    for status, body in results:
        assert status == 200, body
        assert body["finish_reason"] in ("stop", "length") and body["text_output"]
    m = tight_server.metrics()
    assert m['specserve_kv_blocks{state="total"}'] <= 23
    # Either admission waited for room or growth preempted someone: the budget was binding.
    assert m["specserve_preemptions_total"] > 0 or m["specserve_step_sequences_total"] / m["specserve_steps_total"] < 8
    # every block back: free, or holding a finished request's cells for reuse (given up on demand)
    tight_server.wait_metric('specserve_kv_blocks{state="free"}', lambda v: v + tight_server.metrics().get(
        'specserve_kv_blocks{state="retained"}', 0) == m['specserve_kv_blocks{state="total"}'])
