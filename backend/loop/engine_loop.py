"""The continuously batched draft-verify loop (one per model instance): its thread and its step.

Requests are submitted from any thread; a background thread owns the engine and runs
iterations. Each iteration (`step`, below) is:

    admit            the scheduler gives waiting requests free slots and KV blocks
    prefill          a chunk of the prompts still prefilling (the scheduler picks it)
    propose          spec.propose(ctx, running): the policy decides, drafters draft; the
                     scheduler fits the step in memory (drops drafts, preempts the youngest)
    forward          ONE target forward for the batch: each pending token and its drafts
    verify           verifier.verify per sequence: lossless greedy / rejection sampling
    commit           the cache keeps the accepted tokens, spec.commit: drafters and policy learn
    emit             responses leave; finished sequences give back slot and blocks

The speculation itself (policy, drafters, the step protocol) is `policy.speculator.Speculator`;
who runs and with what memory is `scheduler.Scheduler` (torch-free); what the target made of
a draft is `verifier` (pure). This module holds what ties them to the engine and the clients:
the thread, submission, drain and cancellation, prefill, feature sharing, emission. Beside it:
its settings (`config.py`), request intake (`intake.py`: request -> sequence, for both services),
KV reuse across requests (`kv_reuse.py`: retain, restore, reclaim) and structured output's grammar
states and forced rows (`forced_rows.py`).

A sequence joins the speculator when its prefill completes. Memory (backend/loop/memory.py): the
target's KV blocks and the resident model drafters share one byte budget; the policy's memory
actions park a model drafter (its bytes join the pool) or reload it in the background (bytes
taken back first; drafted with again only once the reload signals completion).
"""
from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from typing import Callable, Dict, List, Optional

import torch

from policy import Policy, StepOutcome
from policy.speculator import Active, Proposal, Speculator, Verified

from ..drafters import Drafter
from ..engines.ragged import prefill_groups
from ..generation.request import GenerationRequest
from ..generation.sequence import Sequence
from ..wire import ErrorKind
from . import verifier
from .config import LoopConfig
from .forced_rows import GuidedSequences, with_forced_rows
from .intake import Intake, end_tokens
from .kv_reuse import KVReuse
from .memory import DrafterMemory, KVMemory
from .scheduler import Piece, Scheduler
from .stats import LoopStats
from .warm_up import warm_up

log = logging.getLogger("specserve.loop")


class EngineLoop:
    def __init__(self, engine, tokenizer, drafters: Dict[str, Drafter], policy: Policy,
                 config: LoopConfig = LoopConfig(), clock: Callable[[], float] = time.perf_counter,
                 on_outcome: Optional[Callable[[StepOutcome], None]] = None):
        if config.max_batch > engine.max_slots:
            raise ValueError(f"max_batch {config.max_batch} exceeds the engine's {engine.max_slots} slots")
        if config.limits.max_context > engine.max_context:
            raise ValueError("limits.max_context exceeds the engine's context window")
        self.engine, self.drafters = engine, drafters
        self.cfg, self.clock = config, clock
        self.limits, self.max_batch = config.limits, config.max_batch
        self._listeners: List[Callable[[StepOutcome], None]] = [on_outcome] if on_outcome else []
        self.model_drafters = {n: d for n, d in drafters.items() if d.is_model}
        # Drafters that read the target's features (hidden states) get them after every forward.
        self.feature_drafters = [d for d in drafters.values() if d.wants_features]
        if self.feature_drafters and not engine.supports_hidden:
            raise ValueError(f"drafters {[d.name for d in self.feature_drafters]} read the target's features; "
                             f"engine {engine.name} does not return them")
        # Feature drafters read every prompt position's features: no prompt starts from cached cells.
        reuse = not self.feature_drafters
        streams = getattr(engine, "retain_streams", 0) if config.reuse_kv and reuse else 0
        budget = config.kv_budget_bytes or KVMemory.budget_for(  # retained streams are memory of their own
            (config.max_batch + streams) * config.limits.max_context, engine.kv_bytes_per_token, self.model_drafters)
        self.memory = KVMemory(budget, engine.kv_bytes_per_token, self.model_drafters)
        self.drafter_memory = DrafterMemory(self.model_drafters, ledger=self.memory)
        self.stats = LoopStats()
        self.reuse = KVReuse(engine, tokenizer, self.memory.pool, self.stats, streams=streams,
                             reuse_prefix=config.reuse_prefix and reuse, max_context=config.limits.max_context)
        self.scheduler = Scheduler(config.max_batch, config.prefill_chunk, self.memory.pool, engine, self.stats,
                                   reclaim=self.reuse.reclaim if streams else None, on_admit=self.reuse.restore,
                                   prefill_chunks=config.prefill_chunks)
        eos = end_tokens(engine.shape.eos_token_id, tokenizer)
        self.intake = Intake(tokenizer, config.limits, engine.shape.vocab, eos, kv_block_size=self.pool.block_size,
                             clock=clock)
        # Structured output: drafts cut where they leave a sequence's grammar, forced rows not computed.
        self.guides = GuidedSequences(drafters.values(), skip_forced=not self.feature_drafters)
        self.spec = Speculator(policy, drafters, clock=clock, drafter_blocks=self.memory.drafter_blocks,
                               on_outcome=self._record, lookahead=True, trim=self.guides.trim)
        self.inbox: "queue.Queue[Sequence]" = queue.Queue()
        self.trace: "collections.deque[StepOutcome]" = collections.deque(maxlen=config.trace_len)
        self._last_cancel_check = float("-inf")
        self._stop = threading.Event()
        self._drain_deadline: Optional[float] = None  # self.clock() time; set by drain() (shutdown)
        self._thread: Optional[threading.Thread] = None
        self._warmed = threading.Event()  # set by the loop's thread once the engine's warm-up is over

    @property
    def policy(self) -> Policy:
        return self.spec.policy

    @policy.setter
    def policy(self, policy: Policy) -> None:
        self.spec.policy = policy

    @property
    def running(self) -> List[Sequence]:
        """Sequences holding a batch slot (running[i].slot == i)."""
        return self.scheduler.running

    @property
    def waiting(self) -> "collections.deque[Sequence]":
        """Admitted by the loop thread, waiting for a slot (preempted ones at the head)."""
        return self.scheduler.waiting

    @property
    def pool(self):
        return self.scheduler.pool

    # -- the service contract (backend/services/contract.py; limits and max_batch: __init__) ----
    def add_outcome_listener(self, listener: Callable[[StepOutcome], None]) -> None:
        """Call `listener(outcome)` after every closed step (on the loop thread), after those added before."""
        self._listeners.append(listener)

    # -- submission (any thread) ---------------------------------------------------
    @property
    def queue_depth(self) -> int:
        """Requests waiting for a batch slot (submitted, or preempted), not yet running."""
        return len(self.waiting) + self.inbox.qsize()

    def submit(self, req: GenerationRequest, sink) -> int:
        """Admit (intake.py: ShuttingDown, Overloaded or RequestError if refused) and enqueue."""
        seq = self.intake.sequence(req, sink, draining=self._drain_deadline is not None, queue_depth=self.queue_depth,
                                   max_queue=self.cfg.max_queue)
        self.guides.add(seq)
        self.inbox.put(seq)
        return seq.seq_id

    # -- thread ------------------------------------------------------------------------
    def start(self) -> None:
        """Start the loop's thread; returns once it has warmed the engine up (warm_up.py), so a
        server reports ready with its memory committed."""
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()
        self._warmed.wait()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread; requests still in flight then get a final error (never left hanging)."""
        self._stop.set()
        if self._thread:
            self._thread.join(timeout)
        if self._thread is None or not self._thread.is_alive():
            self._fail_all(ErrorKind.SHUTTING_DOWN.message("the request was stopped before it finished; retry"))

    def drain(self, seconds: float) -> None:
        """Shutdown begins: refuse new requests (ShuttingDown) at once, let the running and
        waiting ones finish for `seconds`, then fail those left with a final error."""
        if self._drain_deadline is None:
            self._drain_deadline = self.clock() + max(0.0, seconds)

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting and self.inbox.empty()

    def _run(self) -> None:
        try:
            warm_up(self.engine)
        finally:
            self._warmed.set()
        while not self._stop.is_set():
            if self._drain_deadline is not None and self.clock() >= self._drain_deadline and not self.idle:
                log.warning("drain time is up: failing %d requests still in flight", len(self.running) + self.queue_depth)
                self._fail_all(ErrorKind.SHUTTING_DOWN.message("the request was stopped before it finished; retry"))
            try:
                if not self.step(block=True):
                    continue
            except Exception:  # keep serving: fail the batch's requests, never hang them
                log.exception("engine step failed; failing the running requests")
                self.spec.abandon()
                self._fail_all(f"{ErrorKind.INTERNAL.prefix} in the engine step; see the server log", inbox=False)

    def _fail_all(self, message: str, inbox: bool = True) -> None:
        """Fail every running and waiting request, and (inbox) every one submitted since (on the
        loop thread, or once it is gone)."""
        if inbox:
            self._drain_inbox(False)
        for seq in list(self.running) + list(self.waiting):
            self._fail(seq, message)
        self.running.clear()
        self.waiting.clear()

    def _fail(self, seq: Sequence, message: str) -> None:
        try:
            seq.sink.error(message)
        except Exception:
            log.exception("could not send error for sequence %d", seq.seq_id)
        self._release(seq)

    # -- one iteration -------------------------------------------------------------------
    def step(self, block: bool = False) -> bool:
        """Admit new requests, prefill (a chunk), then run one speculative step of the
        sequences past their prefill. Returns False if idle."""
        self._drain_inbox(block and not self.running and not self.waiting)
        self._drop_cancelled()
        for seq, why in self.scheduler.admit():
            self._fail(seq, why)
        if not self.running:
            return False
        self._prefill_step()
        if any(not s.prefilling for s in self.running):
            self._speculative_step()
        return True

    def _drain_inbox(self, block: bool) -> None:
        try:
            if block:
                self.waiting.append(self.inbox.get(timeout=0.05))
            while True:
                self.waiting.append(self.inbox.get_nowait())
        except queue.Empty:
            pass

    def _drop_cancelled(self) -> None:
        # Each check is an IPC round trip to the server per sequence: poll a few times a second
        # at most, not every step (a cancelled sequence runs at most one more interval).
        now = self.clock()
        if now - self._last_cancel_check < self.cfg.cancel_poll_s:
            return
        self._last_cancel_check = now
        for seq in [s for s in list(self.waiting) + self.running if s.sink.cancelled()]:
            seq.finish_reason = "cancelled"
            self.stats.cancelled += 1
            if seq in self.waiting:
                self.waiting.remove(seq)
            self._release(seq)
            self._send(seq, final=True)

    # -- prefill ---------------------------------------------------------------------------
    def _prefill_step(self) -> None:
        pieces = self.scheduler.prefill_pieces()
        if not pieces:
            return
        t0, failed, done = self.clock(), [], []
        for group in prefill_groups([end - start for _, start, end in pieces]):
            f, d = self._prefill([pieces[i] for i in group])
            failed += f
            done += d
        self.stats.prefills += len(done)
        self.stats.prefill_tokens += sum(end - start for _, start, end in pieces)
        self.stats.prefill_time_s += self.clock() - t0
        for seq in failed:  # after every group: vacating moves slots
            self._fail(seq, f"{ErrorKind.INTERNAL.prefix} while starting this request; see the server log")
        self._emit([s for s in done if s not in failed])

    def _prefill(self, pieces: List[Piece]) -> tuple:
        """One ragged forward for these pieces (seq, start, end) of prompts; logits only where a
        prompt ends. A completed prefill samples the first token; a preempted sequence recomputes
        its cache (all tokens but the pending one) and samples nothing.
        -> (sequences whose first token could not be sampled (to fail alone), sequences whose
        prefill completed)."""
        seqs = [seq for seq, _, _ in pieces]
        logits, feats = self._forward([s.slot for s in seqs], [start for _, start, _ in pieces],
                                      [s.tokens[start:end] for s, start, end in pieces],  # prefill_ids is a prefix of tokens
                                      logit_rows=[[end - start - 1] if end == s.prefill_len else []
                                                  for s, start, end in pieces])
        row, out_row, failed, done = 0, 0, [], []
        for seq, start, end in pieces:
            complete = end == seq.prefill_len
            self._share_features(seq, start, feats, row, end - start)
            row += end - start
            seq.kv_len = end
            if not complete:
                continue
            i, out_row = out_row, out_row + 1
            done.append(seq)
            resumed = seq.generated > 0
            self.spec.sync(seq.seq_id, seq.tokens if resumed else seq.prompt_ids)  # where the prompt ends
            if not seq.joined:
                seq.joined = True
                self.spec.join(seq.seq_id)
            if resumed:
                continue
            try:
                first, lps = verifier.sample_first(seq, logits[i: i + 1])
            except Exception:
                log.exception("sampling the first token of sequence %d failed; failing it alone", seq.seq_id)
                failed.append(seq)
                continue
            seq.first_token_s = self.clock()
            seq.append([first], self.cfg.limits.max_context, log_probs=lps)
        return failed, done

    def _forward(self, slots, starts, tokens, logit_rows=None):
        """The target's forward: (logits, features of every new position, or None when no
        drafter reads features)."""
        if self.feature_drafters:
            return self.engine.forward(slots, starts, tokens, logit_rows=logit_rows, return_hidden=True)
        return self.engine.forward(slots, starts, tokens, logit_rows=logit_rows), None

    def _share_features(self, seq: Sequence, start: int, feats, row: int, n: int) -> None:
        """Hand the feature drafters the features of positions start..start+n-1 (rows row.. of feats)."""
        for d in self.feature_drafters:
            d.observe_features(seq.seq_id, start, feats[row: row + n])

    # -- the speculative step ----------------------------------------------------------------
    def _active(self, seq: Sequence) -> Active:
        """A running sequence as the speculator sees it."""
        sampling, limits = seq.request.sampling, self.cfg.limits
        room = min(seq.request.max_new_tokens - seq.generated, limits.max_context - seq.kv_len) - 1
        return Active(seq_id=seq.seq_id, tokens=seq.tokens, context_len=seq.kv_len, generated=seq.generated,
                      max_new_tokens=seq.request.max_new_tokens,
                      temperature=0.0 if sampling.greedy else sampling.temperature,
                      generator=seq.generator, room=room)

    def _speculative_step(self) -> None:
        t_start = self.clock()
        by_id = {s.seq_id: s for s in self.running}
        active = [self._active(s) for s in self.running if not s.prefilling]
        ctx = self.spec.context(self.stats.steps, active, queue_len=self.queue_depth,
                                kv_free_blocks=self.pool.num_free, kv_total_blocks=self.pool.num_blocks,
                                tpot_slo_s=self.cfg.tpot_slo_s)
        proposal = self.spec.propose(ctx, active, apply_memory=self._apply_memory_actions,
                                     fit=self._fit_in_memory)
        batch = [by_id[a.seq_id] for a in proposal.batch]  # after preemption
        if not batch:
            self.spec.commit(proposal, [], [])
            return

        t_verify = self.clock()
        # The pending token (last emitted, not yet cached) followed by the drafts.
        inputs = [[seq.tokens[seq.kv_len]] + d for seq, d in zip(batch, proposal.inputs())]
        for seq, inp in zip(batch, inputs):
            self.pool.append(seq.seq_id, len(inp))  # fits: the scheduler reserved it
        rows = self.guides.logit_rows(batch, proposal.drafts)
        logits, feats = self._forward([s.slot for s in batch], [s.kv_len for s in batch], inputs, logit_rows=rows)
        if rows is not None:
            logits = with_forced_rows(logits, [d.tokens for d in proposal.drafts], rows)

        t_accept = self.clock()
        verdicts, failed = self._verify(proposal, batch, logits, feats)
        t_io = self.clock()
        self._emit([s for s in batch if s not in failed])  # may retire finished sequences
        t_end = self.clock()
        self.spec.commit(proposal, verdicts, [s.tokens for s in batch], verify_time_s=t_accept - t_verify,
                         accept_time_s=t_io - t_accept, io_time_s=t_end - t_io, total_time_s=t_end - t_start)
        for seq in failed:  # after the step: vacating moves slots the step still read
            self._fail(seq, f"{ErrorKind.INTERNAL.prefix} while verifying this request; see the server log")

    def _verify(self, proposal: Proposal, batch: List[Sequence], logits: torch.Tensor, feats):
        """Verify each sequence's draft against the target's logits (lossless) and commit what
        it emits. logits: [sum(1 + len(draft)), V], sequences in batch order.
        -> (verdicts in batch order, sequences whose verification raised: they emit nothing
        and are failed after the step; the others are unaffected)."""
        argmax = verifier.row_argmax(logits)
        verdicts, failed, row = [], [], 0
        for seq, draft in zip(batch, proposal.drafts):
            n = len(draft) + 1
            try:
                checked = verifier.verify(seq, draft, logits[row: row + n], argmax[row: row + n])
                self._commit(seq, len(draft), checked, feats, row)
                verdicts.append(Verified(accepted=checked.accepted, emitted=len(checked.tokens),
                                         p_draft=checked.p_draft, kl=checked.kl, tv=checked.tv))
            except Exception:
                log.exception("verifying sequence %d failed; failing it alone", seq.seq_id)
                verdicts.append(Verified(accepted=0, emitted=0))
                failed.append(seq)
            row += n
        return verdicts, failed

    def _commit(self, seq: Sequence, drafted: int, checked: verifier.Checked, feats, row: int) -> None:
        """Cached now: the pending token + the accepted drafts (rows row.. of the step's
        features); the rejected drafts are forgotten. The emitted tokens join the sequence."""
        self._share_features(seq, seq.kv_len, feats, row, 1 + checked.accepted)
        seq.kv_len += 1 + checked.accepted
        self.pool.truncate(seq.seq_id, seq.kv_len)
        self.engine.truncate(seq.slot, seq.kv_len)
        seq.drafted += drafted
        seq.accepted += checked.accepted
        seq.append(checked.tokens, self.cfg.limits.max_context, log_probs=checked.log_probs)

    def _record(self, outcome: StepOutcome) -> None:
        """Every closed step: trace, statistics, the listeners (trace writer, metrics)."""
        self.trace.append(outcome)
        self.stats.count_step(outcome)
        self.stats.drafter_errors = self.spec.drafter_errors
        for listener in self._listeners:
            listener(outcome)

    def _fit_in_memory(self, gammas: Dict[int, int]) -> Dict[int, int]:
        gammas, preempted = self.scheduler.fit(gammas)
        for seq in preempted:
            if seq.joined:
                self.spec.suspend(seq.seq_id)
        return gammas

    def _apply_memory_actions(self, actions) -> None:
        self.drafter_memory(actions)
        self.stats.drafter_parks, self.stats.drafter_reloads = self.drafter_memory.parks, self.drafter_memory.reloads

    # -- responses -------------------------------------------------------------------------
    def _emit(self, seqs: List[Sequence]) -> None:
        """Send what each sequence produced; retire finished ones."""
        retained = []
        for seq in seqs:
            if seq.finished:
                retained.append(self.reuse.retain(seq))  # before its slot is vacated
                self._release(seq)
                self.stats.finished += 1
                self._send(seq, final=True)
            elif seq.request.stream:
                self._send(seq, final=False)
        self.reuse.count(retained)

    def _send(self, seq: Sequence, final: bool) -> None:
        try:
            seq.respond(final)
        except Exception:
            # The client is gone (or the sender broke): stop generating for it.
            log.warning("sending to sequence %d failed; cancelling it", seq.seq_id, exc_info=True)
            if not seq.finished:
                seq.finish_reason = "cancelled"
                self._release(seq)

    def _release(self, seq: Sequence) -> None:
        """The sequence is done (finished, cancelled or failed): slot and blocks back, drafters and
        policy forget it."""
        self.scheduler.vacate(seq)
        self.guides.remove(seq.seq_id)
        if seq.joined:
            self.spec.leave(seq.seq_id)
