"""The speculation component's step protocol, with scripted drafters and policies."""
from policy import Arm, Decision, MemoryAction, Policy
from policy.speculator import Active, Draft, Speculator, Verified


class Scripted(Policy):
    name = "scripted-test"

    def __init__(self, arms, keep=None, actions=()):
        super().__init__()
        self.arms, self.keep, self.actions = arms, keep, actions
        self.calls = []

    def decide(self, ctx):
        self.calls.append(("decide", [v.seq_id for v in ctx.sequences]))
        return Decision(arms=dict(self.arms), memory_actions=self.actions)

    def continue_drafting(self, ctx, seq_id, confidences):
        self.calls.append(("continue", seq_id, len(confidences)))
        return len(confidences) < 2

    def verify_lengths(self, ctx, drafts):
        return {s: min(len(q), self.keep) for s, q in drafts.items()} if self.keep is not None else \
            super().verify_lengths(ctx, drafts)

    def observe(self, outcome):
        self.calls.append(("observe", outcome.step))

    def on_request_start(self, seq_id):
        self.calls.append(("start", seq_id))

    def on_request_end(self, seq_id):
        self.calls.append(("end", seq_id))


class Lookup:
    """A model-free drafter proposing 7, 8, 9, ..."""
    is_model, resident = False, True

    def __init__(self, name="lookup", fail=False):
        self.name, self.fail = name, fail
        self.released, self.committed = [], {}

    def propose_batch(self, requests, keep_going=None):
        if self.fail:
            raise RuntimeError("drafter broke")
        return [Draft(tokens=list(range(7, 7 + r.gamma)), confidences=[1.0] * r.gamma) for r in requests]

    def commit(self, seq_id, tokens):
        self.committed[seq_id] = list(tokens)

    def release(self, seq_id):
        self.released.append(seq_id)


class Model(Lookup):
    """A model drafter: asks keep_going between sub-steps."""
    is_model = True

    def propose_batch(self, requests, keep_going=None):
        out = []
        for r in requests:
            d = Draft(tokens=[], confidences=[])
            while len(d) < r.gamma:
                d.tokens.append(5)
                d.confidences.append(0.9)
                if len(d) < r.gamma and not keep_going(r.seq_id, d.confidences):
                    break
            out.append(d)
        return out


def seqs(*ids, room=10):
    return [Active(i, [1, 2, 3], 3, 1, 16, room=room) for i in ids]


def step(spec, active, verdicts=None, **kw):
    ctx = spec.context(0, active)
    p = spec.propose(ctx, active, **kw)
    verdicts = verdicts or [Verified(len(d), len(d) + 1) for d in p.drafts]
    return p, spec.commit(p, verdicts, [list(a.tokens) + [0] for a in p.batch])


def test_one_step_in_protocol_order():
    pol = Scripted({1: Arm("model", 4), 2: Arm("lookup", 3)})
    spec = Speculator(pol, {"model": Model("model"), "lookup": Lookup()})
    spec.join(1)
    spec.join(2)
    p, out = step(spec, seqs(1, 2))
    assert [c[0] for c in pol.calls] == ["start", "start", "decide", "continue", "continue", "observe"]
    assert [len(d) for d in p.drafts] == [2, 3]  # the policy stopped the model drafter after 2
    s1, s2 = out.sequences
    assert (s1.planned, s1.requested, s1.drafted, s1.gamma) == (Arm("model", 4), 4, 2, 2)
    assert (s2.planned, s2.drafted, s2.accepted, s2.emitted) == (Arm("lookup", 3), 3, 3, 4)
    assert out.joined == (1, 2) and out.context.batch_size == 2


def test_gamma_is_capped_by_room_and_residency():
    drafters = {"lookup": Lookup(), "model": Model("model")}
    drafters["model"].resident = False
    spec = Speculator(Scripted({1: Arm("lookup", 8), 2: Arm("model", 3), 3: Arm("nobody", 3)}), drafters)
    p, out = step(spec, seqs(1, 2, 3, room=2))
    assert [s.requested for s in out.sequences] == [2, 0, 0]
    assert [s.drafter for s in out.sequences] == ["lookup", None, None]


def test_verify_lengths_trims_and_the_outcome_keeps_every_confidence():
    spec = Speculator(Scripted({1: Arm("lookup", 4)}, keep=1), {"lookup": Lookup()})
    p, out = step(spec, seqs(1))
    assert p.drafts[0].tokens == [7]
    s = out.sequences[0]
    assert (s.drafted, s.gamma, len(s.confidences), s.q_draft) == (4, 1, 4, [1.0])


def test_a_failing_drafter_costs_its_sequences_their_drafts_only():
    spec = Speculator(Scripted({1: Arm("bad", 3), 2: Arm("lookup", 3)}),
                      {"bad": Lookup("bad", fail=True), "lookup": Lookup()})
    p, out = step(spec, seqs(1, 2))
    assert [len(d) for d in p.drafts] == [0, 3] and spec.drafter_errors == 1


def test_fit_drops_sequences_and_cuts_gammas():
    spec = Speculator(Scripted({1: Arm("lookup", 3), 2: Arm("lookup", 3)}), {"lookup": Lookup()})
    p, out = step(spec, seqs(1, 2), fit=lambda g: {1: 0})
    assert [a.seq_id for a in p.batch] == [1] and out.sequences[0].requested == 0


def test_memory_actions_reach_the_driver_before_drafting():
    applied = []
    spec = Speculator(Scripted({}, actions=(MemoryAction("offload", "model"),)), {"lookup": Lookup()})
    p, out = step(spec, seqs(1), apply_memory=applied.extend)
    assert applied == [MemoryAction("offload", "model")] and out.memory_actions == (MemoryAction("offload", "model"),)


def test_leaving_mid_step_defers_the_drafters_release_and_the_policys_end():
    pol = Scripted({1: Arm("lookup", 2)})
    lookup = Lookup()
    spec = Speculator(pol, {"lookup": lookup})
    active = seqs(1)
    p = spec.propose(spec.context(0, active), active)
    spec.leave(1)  # the driver retires it while the step is in flight
    assert lookup.released == []
    out = spec.commit(p, [Verified(2, 3)], [[1, 2, 3, 7, 8, 0]])
    assert lookup.committed[1][-1] == 0 and lookup.released == [1]
    assert out.left == (1,) and pol.calls[-2:] == [("observe", 0), ("end", 1)]
    spec.leave(2)  # between steps: drafters forget at once
    assert lookup.released == [1, 2]


def test_abandon_releases_what_a_failed_step_held():
    lookup = Lookup()
    spec = Speculator(Scripted({1: Arm("lookup", 2)}), {"lookup": lookup})
    active = seqs(1)
    spec.propose(spec.context(0, active), active)
    spec.suspend(1)
    assert lookup.released == []
    spec.abandon()
    assert lookup.released == [1]


class LookingAhead(Scripted):
    def lookahead(self):
        return {"lookup": 4, "model": 4}


class Counting(Lookup):
    """Proposes 7, 8, 9, ... for sequence 1 and nothing for the others; counts its calls."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def propose_batch(self, requests, keep_going=None):
        self.calls += 1
        return [Draft(tokens=list(range(7, 7 + r.gamma)) if r.seq_id == 1 else [],
                      confidences=[1.0] * r.gamma if r.seq_id == 1 else []) for r in requests]


def test_lookahead_shows_ready_drafts_plays_them_and_checks_the_rest():
    lookup = Counting()
    spec = Speculator(LookingAhead({1: Arm("lookup", 2)}), {"lookup": lookup, "model": Model("model")},
                      lookahead=True)
    active = seqs(1, 2)
    ctx = spec.context(0, active)
    assert [v.available for v in ctx.sequences] == [{"lookup": 4}, {"lookup": 0}]  # model drafters: not asked
    p = spec.propose(ctx, active)
    assert lookup.calls == 1  # the played arm used the ready draft
    assert [d.tokens for d in p.drafts] == [[7, 8], []]
    out = spec.commit(p, [Verified(2, 3), Verified(0, 1)], [[1, 2, 3, 7, 8, 0], [1, 2, 3, 0]])
    assert [s.shadow for s in out.sequences] == [[], []]  # played, and nothing ready


def test_drafts_not_played_are_checked_against_committed_tokens():
    spec = Speculator(LookingAhead({}), {"lookup": Counting()}, lookahead=True)
    active = seqs(1)
    p = spec.propose(spec.context(0, active), active)
    out = spec.commit(p, [Verified(0, 1)], [[1, 2, 3, 7]])  # plain decoding emitted 7: the draft's first token
    assert out.sequences[0].shadow == [("lookup", 1, 1)]
    p = spec.propose(spec.context(1, active), active)
    out = spec.commit(p, [Verified(0, 1)], [[1, 2, 3, 5]])
    assert out.sequences[0].shadow == [("lookup", 0, 1)]


def test_without_lookahead_nothing_is_asked_before_the_decision():
    lookup = Counting()
    spec = Speculator(LookingAhead({}), {"lookup": lookup})
    ctx = spec.context(0, seqs(1))
    assert ctx.sequences[0].available is None and lookup.calls == 0


class Striding(LookingAhead):
    def lookahead_stride(self, batch_size):
        return 2


def test_a_lookahead_stride_asks_for_one_sequence_in_so_many_each_in_turn():
    lookup = Counting()
    spec = Speculator(Striding({}), {"lookup": lookup}, lookahead=True)
    active = seqs(1, 2, 3, 4)
    asked = []
    for step in (0, 1):
        ctx = spec.context(step, active)
        asked.append([v.seq_id for v in ctx.sequences if v.available])
        spec.commit(spec.propose(ctx, active), [Verified(0, 1)] * 4, [s.tokens + [0] for s in active])
    assert asked == [[2, 4], [1, 3]]  # seq_id + step even: every sequence once in two steps
