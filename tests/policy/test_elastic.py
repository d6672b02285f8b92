from policy.elastic import ElasticMemory
from policy.types import DrafterInfo
from helpers import NGRAM, ctx

TOTAL = 1000  # tau_low = 100 blocks; N_draft = 100


def _drafter(resident):
    return DrafterInfo("draft", True, resident, size_blocks=100)


def test_offload_needs_persistence_and_sd_off():
    m = ElasticMemory(0.1, t_persist=3)
    c = ctx(drafters=(_drafter(True), NGRAM), kv_free=50, kv_total=TOTAL, queue=4)
    assert m.update(c, sd_enabled=True) == []
    assert m.update(c, sd_enabled=False) == [] and m.update(c, sd_enabled=False) == []
    acts = m.update(c, sd_enabled=False)
    assert [(a.kind, a.drafter) for a in acts] == [("offload", "draft")]


def test_reload_needs_empty_queue_and_headroom_then_waits_for_completion():
    m = ElasticMemory(0.1, t_persist=1)
    m.update(ctx(drafters=(_drafter(True),), kv_free=10, kv_total=TOTAL, queue=2), sd_enabled=False)
    parked = (_drafter(False),)
    assert m.update(ctx(drafters=parked, kv_free=500, kv_total=TOTAL, queue=1), False) == []  # queue waits
    assert m.update(ctx(drafters=parked, kv_free=150, kv_total=TOTAL, queue=0), False) == []  # 150 < 100+100
    acts = m.update(ctx(drafters=parked, kv_free=250, kv_total=TOTAL, queue=0), False)
    assert [(a.kind, a.drafter) for a in acts] == [("reload", "draft")]
    # still reloading (engine has not reported it resident): no second reload, no offload
    assert m.update(ctx(drafters=parked, kv_free=250, kv_total=TOTAL, queue=0), False) == []


def test_no_oscillation_when_load_hovers_around_threshold():
    m = ElasticMemory(0.1, t_persist=5)
    resident, events = True, []
    for t in range(400):
        free = 100 + (8 if t % 2 else -8) + (t % 7) - 3  # hovers around tau_low = 100
        if not resident:
            free += 100  # the parked drafter's blocks went to the pool
        queue = 1 if t % 3 else 0
        for a in m.update(ctx(drafters=(_drafter(resident),), kv_free=free, kv_total=TOTAL, queue=queue),
                          sd_enabled=False):
            events.append((t, a.kind))
            resident = a.kind == "reload"
    assert len(events) <= 1  # at most one offload, never a reload/offload cycle


def test_nightjar_emits_offload_under_pressure_at_large_batch():
    import random
    from policy import make_policy
    from helpers import outcome, seq
    pol = make_policy("nightjar", drafter="draft", t_persist=3, rng=random.Random(0))
    kinds = []
    for t in range(300):
        c = ctx(batch=4, step=t, drafters=(_drafter(True),), kv_free=20, kv_total=TOTAL, queue=5)
        d = pol.decide(c)
        kinds += [a.kind for a in d.memory_actions]
        g = d.arm_for(0).gamma
        pol.observe(outcome([seq(i, gamma=g, accepted=0) for i in range(4)], total=0.05 + 0.02 * g))
    assert "offload" in kinds and "reload" not in kinds
