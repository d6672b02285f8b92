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
the thread, submission, drain and cancellation, prefix reuse, feature sharing, emission.

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
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import torch

from policy import Policy, StepOutcome
from policy.speculator import Active, Proposal, Speculator, Verified

from ..generation.detokenizer import IncrementalDetokenizer
from ..drafters import Drafter
from ..generation.guided import GuideCompiler, GuidedProcessor, GuideError, GuideState
from ..generation.logits_processors import LogitsProcessor, tokenize_words
from .memory import DrafterMemory, KVMemory
from ..engines.ragged import prefill_groups
from ..generation.request import GenerationRequest, Limits, RequestError, admit, chat_prefix
from ..generation.sequence import Sequence
from ..server_config import ServerConfig
from ..wire import ErrorKind
from . import verifier
from .retained import RetainedPrompts
from .scheduler import Piece, Scheduler
from .stats import LoopStats

log = logging.getLogger("specserve.loop")


@dataclass(frozen=True)
class LoopConfig:
    """The loop's settings. The server builds them from its ServerConfig (from_server); the
    defaults shared with it are ServerConfig's own, so tests and benchmarks that build a loop
    directly run what the server runs."""
    max_batch: int = 8  # running sequences (engine slots)
    limits: Limits = Limits()
    trace_len: int = 0  # StepOutcomes kept in memory for inspection (tests and benchmarks ask for some)
    tpot_slo_s: Optional[float] = None  # time-per-output-token target handed to the policy
    cancel_poll_s: float = 0.05  # how often to ask the sinks whether their clients cancelled
    kv_budget_bytes: Optional[int] = None  # target KV + resident drafters; None = room for every slot
    max_queue: int = 0  # waiting requests beyond which submit refuses new ones (Overloaded); 0 = no bound
    # Prompt tokens prefilled per iteration, between decode steps; 0 = whole prompts at once.
    # 128: on the 2-core EPYC, llama.cpp Q8_0, a 2,040-token prompt costs about the same in chunks
    # of 128 as whole, and running streams wait at most 1.1 s instead of 11 s (0.6 s at 64, for
    # 5% more time to the long prompt's first token): bench/bench_chunked_prefill.py.
    prefill_chunk: int = ServerConfig.prefill_chunk
    # Chunks an iteration may prefill when that many prompts are prefilling (one chunk a prompt):
    # copy-heavy prompts at 32 streams 1.35-1.45x tokens/s, TTFT 12 s -> ~2.7 s (docs/results.md).
    prefill_chunks: int = ServerConfig.prefill_chunks
    # Prompts that start with the chat template's shared tokens copy them from a stream the engine
    # keeps (llama.cpp's prefix_stream) instead of prefilling them: bit-identical, ~17% of a prompt.
    reuse_prefix: bool = ServerConfig.reuse_prefix
    # Finished sequences' cells are kept in the engine's retained streams (llama.cpp's retain_streams)
    # for later prompts that start with the same tokens (backend/loop/retained.py).
    reuse_kv: bool = True

    @classmethod
    def from_server(cls, cfg: ServerConfig) -> "LoopConfig":
        """The loop a ServerConfig serves. Nothing in the server reads an in-memory trace
        (trace_file writes one out; at 64 streams 10,000 outcomes held ~100 MiB after 10 minutes)."""
        return cls(max_batch=cfg.max_batch, limits=Limits(max_tokens=cfg.max_tokens_limit, max_context=cfg.max_context),
                   tpot_slo_s=cfg.tpot_slo_ms / 1000 if cfg.tpot_slo_ms > 0 else None,
                   kv_budget_bytes=cfg.kv_budget_mb * 2**20 if cfg.kv_budget_mb > 0 else None,
                   max_queue=cfg.max_queue or 4 * cfg.max_batch, prefill_chunk=cfg.prefill_chunk,
                   prefill_chunks=cfg.prefill_chunks, trace_len=0,
                   reuse_prefix=cfg.reuse_prefix, reuse_kv=cfg.kv_reuse_streams > 0)


class EngineLoop:
    def __init__(self, engine, tokenizer, drafters: Dict[str, Drafter], policy: Policy,
                 config: LoopConfig = LoopConfig(), clock: Callable[[], float] = time.perf_counter,
                 on_outcome: Optional[Callable[[StepOutcome], None]] = None):
        if config.max_batch > engine.max_slots:
            raise ValueError(f"max_batch {config.max_batch} exceeds the engine's {engine.max_slots} slots")
        if config.limits.max_context > engine.max_context:
            raise ValueError("limits.max_context exceeds the engine's context window")
        self.engine, self.tok, self.drafters = engine, tokenizer, drafters
        self.cfg, self.clock = config, clock
        self._listeners: List[Callable[[StepOutcome], None]] = [on_outcome] if on_outcome else []
        self.model_drafters = {n: d for n, d in drafters.items() if d.is_model}
        # Drafters that read the target's features (hidden states) get them after every forward.
        self.feature_drafters = [d for d in drafters.values() if d.wants_features]
        if self.feature_drafters and not engine.supports_hidden:
            raise ValueError(f"drafters {[d.name for d in self.feature_drafters]} read the target's features; "
                             f"engine {engine.name} does not return them")
        streams = getattr(engine, "retain_streams", 0) if config.reuse_kv and not self.feature_drafters else 0
        budget = config.kv_budget_bytes or KVMemory.budget_for(  # retained streams are memory of their own
            (config.max_batch + streams) * config.limits.max_context, engine.kv_bytes_per_token, self.model_drafters)
        self.memory = KVMemory(budget, engine.kv_bytes_per_token, self.model_drafters)
        self.drafter_memory = DrafterMemory(self.model_drafters, ledger=self.memory)
        self.stats = LoopStats()
        self.retained = RetainedPrompts(streams, self.memory.pool) if streams else None
        self.scheduler = Scheduler(config.max_batch, config.prefill_chunk, self.memory.pool, engine, self.stats,
                                   reclaim=self._reclaim if self.retained else None, on_admit=self._start_cached,
                                   prefill_chunks=config.prefill_chunks)
        # Structured output: the grammar states of guided sequences, shared with the grammar drafter;
        # every drafter's drafts are cut where they leave a sequence's grammar.
        self.guide_compiler = GuideCompiler(tokenizer, engine.shape.vocab)
        self.guides: Dict[int, GuideState] = {}
        for d in drafters.values():
            if getattr(d, "wants_guides", False):
                d.guides = self.guides
        self.spec = Speculator(policy, drafters, clock=clock, drafter_blocks=self.memory.drafter_blocks,
                               on_outcome=self._record, lookahead=True, trim=self._grammar_prefix)
        self.inbox: "queue.Queue[Sequence]" = queue.Queue()
        self.trace: "collections.deque[StepOutcome]" = collections.deque(maxlen=config.trace_len)
        self._ids = iter(range(1, 1 << 62))
        self._last_cancel_check = float("-inf")
        self._stop = threading.Event()
        self._drain_deadline: Optional[float] = None  # self.clock() time; set by drain() (shutdown)
        self._thread: Optional[threading.Thread] = None
        self.prefix_ids: List[int] = []
        if config.reuse_prefix and getattr(engine, "supports_prefix", False) and not self.feature_drafters:
            self.prefix_ids = chat_prefix(tokenizer)[: config.limits.max_context // 2]
            if self.prefix_ids:
                engine.set_prefix(self.prefix_ids)
        eos = engine.shape.eos_token_id
        self.default_eos = frozenset({eos} | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()))

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

    # -- the service contract (backend/services/contract.py) ------------------------------
    @property
    def limits(self) -> Limits:
        return self.cfg.limits

    @property
    def max_batch(self) -> int:
        return self.cfg.max_batch

    def add_outcome_listener(self, listener: Callable[[StepOutcome], None]) -> None:
        """Call `listener(outcome)` after every closed step (on the loop thread), after those added before."""
        self._listeners.append(listener)

    # -- submission (any thread) ---------------------------------------------------
    @property
    def queue_depth(self) -> int:
        """Requests waiting for a batch slot (submitted, or preempted), not yet running."""
        return len(self.waiting) + self.inbox.qsize()

    def submit(self, req: GenerationRequest, sink) -> int:
        """Admit (backend/request.admit: ShuttingDown, Overloaded or RequestError if refused) and
        enqueue."""
        a = admit(req, self.tok, self.cfg.limits, self.engine.shape.vocab, self.default_eos,
                  draining=self._drain_deadline is not None, queue_depth=self.queue_depth, max_queue=self.cfg.max_queue)
        gen = None if req.sampling.greedy else torch.Generator().manual_seed(a.seed)
        processor = guide = None
        if not req.penalties.neutral or req.bad_words_ids:  # requests without penalties pay nothing per step
            bad = tokenize_words(self.tok, req.penalties.bad_words) + [list(w) for w in req.bad_words_ids]
            processor = LogitsProcessor(req.penalties, bad, a.eos_ids,
                                        temperature=0.0 if req.sampling.greedy else req.sampling.temperature)
        if req.guide is not None:
            try:
                guide = self.guide_compiler.compile(req.guide, len(a.prompt_ids), a.eos_ids)
            except GuideError as e:
                raise RequestError(str(e)) from None
            processor = GuidedProcessor(guide, processor)
        seq = Sequence(seq_id=next(self._ids), request=req, sink=sink, prompt_ids=a.prompt_ids,
                       tokens=list(a.prompt_ids), detok=IncrementalDetokenizer(self.tok, a.prompt_ids),
                       eos_ids=a.eos_ids, generator=gen, seed=a.seed, arrival_s=self.clock(), processor=processor,
                       kv_block_size=self.pool.block_size, guide=guide)
        if guide is not None:
            self.guides[seq.seq_id] = guide
        self.inbox.put(seq)
        return seq.seq_id

    # -- thread ------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

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

    def _start_cached(self, seq: Sequence) -> None:
        """An admitted prompt starts from cached cells where it can (copied into its slot now, before
        anything else admitted may need the retained cells' blocks): the longest prefix it shares with
        a finished sequence's retained cells, or the chat template's shared first tokens from the
        engine's prefix stream; only the rest is prefilled."""
        p = self.prefix_ids
        if seq.kv_len:
            return
        shared = len(p) if p and seq.prefill_len > len(p) and seq.tokens[: len(p)] == p else 0
        if self._restore_retained(seq, longer_than=shared) or not shared:
            return
        try:
            seq.kv_len = self.engine.load_prefix(seq.slot)
        except Exception:  # the prompt is prefilled whole instead; so are later ones
            log.exception("copying the shared prompt prefix failed; prefix reuse is off from now")
            self.prefix_ids = []
            return
        self._count_reuse(seq)

    def _restore_retained(self, seq: Sequence, longer_than: int) -> bool:
        """Copy the longest prefix of seq's prompt that retained cells hold (if longer than
        `longer_than`; one prompt token is always left to prefill: its logits give the first token)."""
        if self.retained is None or seq.generated:
            return False
        self.stats.kv_reuse_lookups += 1
        stream, n = self.retained.match(seq.tokens, seq.prefill_len - 1)
        if n <= longer_than:
            return False
        try:
            self.engine.restore(stream, seq.slot, n)
        except Exception:
            log.exception("restoring retained cells failed; prefilling the prompt whole")
            self.engine.truncate(seq.slot, 0)
            return False
        self.retained.hit(stream)
        seq.kv_len = n
        self.stats.kv_reuse_hits += 1
        self._count_reuse(seq)
        return True

    def _count_reuse(self, seq: Sequence) -> None:
        """seq starts from kv_len cached cells: counted as reused tokens each time (a resumed sequence
        too), and as the request's reused blocks (return_perf_metrics, the metrics) only the first time."""
        self.stats.prefix_tokens_reused += seq.kv_len
        if not seq.generated:
            seq.reused_tokens = seq.kv_len
            self.stats.kv_blocks_reused += seq.kv_len // self.pool.block_size

    def _reclaim(self, seq: Optional[Sequence]) -> bool:
        """Give up retained cells for blocks someone needs now: the least recently used first, and
        those the sequence being admitted (if any) would reuse last."""
        mine = self.retained.match(seq.tokens, seq.prefill_len - 1)[0] if seq is not None and not seq.generated else -1
        return self.retained.evict_one(but=mine) or self.retained.evict_one()

    def _retain(self, seq: Sequence) -> int:
        """A finished sequence leaves its cached cells to a retained stream (before its slot is vacated)
        -> the stream, whose blocks the caller counts once the sequence gave its own back; -1 if none."""
        if self.retained is None or seq.slot < 0 or seq.kv_len < self.retained.min_tokens:
            return -1
        n = min(seq.kv_len, len(seq.tokens))  # a stop may have left accepted drafts' cells uncommitted
        tokens = seq.tokens[:n]
        stream = self.retained.keep(tokens)
        if stream < 0:  # already retained
            return -1
        try:
            self.engine.retain(seq.slot, stream, n)
        except Exception:
            log.exception("retaining the cells of sequence %d failed", seq.seq_id)
            self.retained.forget(stream)
            return -1
        return stream

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

    def _grammar_prefix(self, seq_id: int, tokens, draft) -> int:
        """The speculator's trim: a guided sequence's draft as far as its grammar allows it."""
        guide = self.guides.get(seq_id)
        return len(draft) if guide is None else guide.valid_prefix(tokens, draft)

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
        room = min(seq.request.max_tokens - seq.generated, limits.max_context - seq.kv_len) - 1
        return Active(seq_id=seq.seq_id, tokens=seq.tokens, context_len=seq.kv_len, generated=seq.generated,
                      max_new_tokens=seq.request.max_tokens,
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
        rows = self._logit_rows(batch, proposal.drafts)
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

    def _logit_rows(self, batch: List[Sequence], drafts) -> Optional[List[List[int]]]:
        """The rows of the step whose logits it needs, per sequence: all but those of draft tokens
        a guided sequence's grammar forces (GuideState.forced_rows: the constrained target emits
        them whatever the logits; skipping them saves the LM head, ~13% of a row's cost here).
        None when every row is needed."""
        if self.feature_drafters or not self.guides:
            return None
        rows, skipped = [], False
        for seq, d in zip(batch, drafts):
            n = len(d) + 1
            if seq.guide is None or n == 1:
                rows.append(list(range(n)))
                continue
            try:
                forced = seq.guide.forced_rows(seq.tokens, d.tokens)
            except Exception:  # its verification meets the same trouble and fails it alone (_verify)
                log.exception("sequence %d: its grammar's masks failed; computing every row", seq.seq_id)
                forced = [False] * len(d)
            rows.append([j for j in range(n) if j == n - 1 or not forced[j]])
            skipped = skipped or len(rows[-1]) < n
        return rows if skipped else None

    def _verify(self, proposal: Proposal, batch: List[Sequence], logits: torch.Tensor, feats):
        """Verify each sequence's draft against the target's logits (lossless) and commit what
        it emits. logits: [sum(1 + len(draft)), V], sequences in batch order.
        -> (verdicts in batch order, sequences whose verification raised: they emit nothing
        and are failed after the step; the others are unaffected)."""
        argmax = logits.argmax(dim=-1).tolist()
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
                retained.append(self._retain(seq))
                self._release(seq)
                self.stats.finished += 1
                self._send(seq, final=True)
            elif seq.request.stream:
                self._send(seq, final=False)
        # their sequences' blocks are back in the pool now. Sequences finishing in one step may
        # claim the same stream (the later one outgrew the earlier one's tokens, or took its
        # place): its blocks are counted once, for what it holds now.
        for stream in dict.fromkeys(retained):
            if stream >= 0:
                self.retained.count(stream)

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
        self.guides.pop(seq.seq_id, None)
        if seq.joined:
            self.spec.leave(seq.seq_id)


def with_forced_rows(computed: torch.Tensor, drafts: List[List[int]], rows: List[List[int]]) -> torch.Tensor:
    """The step's logits, one row per input token in batch order, from the rows computed
    (`rows` of each sequence, stacked) and, for the rows left out, a point mass on the draft
    token the grammar forces there (its constrained distribution: what verification then sees)."""
    sizes = [len(d) + 1 for d in drafts]
    starts = [0]
    for n in sizes[:-1]:
        starts.append(starts[-1] + n)
    kept, left = [], []  # rows computed; (row, forced token) of those left out
    for at, n, r, d in zip(starts, sizes, rows, drafts):
        computed_rows = set(r)
        kept += [at + j for j in r]
        left += [(at + j, int(d[j])) for j in range(n) if j not in computed_rows]
    full = torch.empty((sum(sizes), computed.shape[1]), dtype=computed.dtype)
    full.index_copy_(0, torch.tensor(kept, dtype=torch.long), computed)
    if left:
        idx = torch.tensor([i for i, _ in left], dtype=torch.long)
        full.index_fill_(0, idx, float("-inf"))
        full[idx, torch.tensor([t for _, t in left], dtype=torch.long)] = 0.0
    return full
