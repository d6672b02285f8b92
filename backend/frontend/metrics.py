"""Prometheus metrics of the service (backend/services/contract.py), published on Triton's metrics port.

Three groups, every series labelled `model` and `version` (Triton's model name and version):

* the families a TensorRT-LLM deployment publishes (`nv_trt_llm_*`, `nv_llm_*_token_len`),
  with NVIDIA's names and label keys, each value computed from the service — so dashboards and
  alerts written for TensorRT-LLM work unchanged (docs/metrics.md says what each means here);
* our own `specserve_*` counters and gauges: steps, tokens, acceptance, γ, the policy's
  decisions by arm, drafter residency, KV blocks, phases;
* `specserve_requests_rejected_total{reason}`: Triton counts a decoupled model's request as a
  success once `execute()` returns, whatever error the model later sends, so its
  `nv_inference_request_failure` never sees our refusals;
* `specserve_edge_requests_refused_total{api,status,reason}`: requests the HTTP edge answers with
  an error before they reach Triton (the OpenAI API's 400s, bodies over the limit, malformed
  JSON, ...). The edge runs in the launcher's process, so it hands its totals over in a file
  (`EdgeRefusals`).

Importable without Triton: the publisher is handed `triton_python_backend_utils` (or a fake
in tests). Values are published from a side thread twice a second, not per step: each
update is an IPC round trip to the server that the step's hot path should not pay. The service's
thread only does a few dict increments per step (`StepStats.observe`).
"""
from __future__ import annotations

import collections
import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from ..services import Service

log = logging.getLogger("specserve")

# Buckets of NVIDIA's nv_llm_{input,output}_token_len histograms (custom_metrics_reporter.cc).
TOKEN_LEN_BUCKETS = [10.0, 50.0, 100.0, 500.0, 1000.0]
# Seconds, for time to first response and request duration (CPU steps are tens of ms).
LATENCY_BUCKETS = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0]
# pb_utils.TritonError code names (as backend/frontend/triton_models/model.py sends them) -> reason label.
REJECT_REASONS = {"INVALID_ARG": "invalid", "UNAVAILABLE": "unavailable", "INTERNAL": "internal"}
# HTTP status -> reason label of an edge refusal that carries no more precise code.
EDGE_REASONS = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed", 408: "timeout",
                413: "body_too_large", 415: "unsupported_media_type", 431: "headers_too_large", 500: "internal",
                503: "unavailable"}
EDGE_REFUSALS_ENV = "SPECSERVE_EDGE_REFUSALS"  # the file the launcher names for the edge and the model

COUNTERS = {  # metric name -> (LoopStats field, help)
    "specserve_steps_total": ("steps", "speculative steps run"),
    "specserve_step_sequences_total": ("sequence_steps", "sum over steps of the running batch size"),
    "specserve_tokens_emitted_total": ("emitted", "tokens emitted by steps (excludes each request's first token)"),
    "specserve_tokens_drafted_total": ("drafted", "draft tokens verified by the target"),
    "specserve_tokens_accepted_total": ("accepted", "draft tokens accepted"),
    "specserve_prefill_tokens_total": ("prefill_tokens", "prompt tokens computed by prefills (recomputation included)"),
    "specserve_prefix_tokens_reused_total": ("prefix_tokens_reused", "prompt tokens copied from cached cells (a finished request's retained cells, or the shared chat-template prefix), not prefilled"),
    "specserve_kv_reuse_lookups_total": ("kv_reuse_lookups", "new prompts looked up among finished requests' retained KV cells"),
    "specserve_kv_reuse_hits_total": ("kv_reuse_hits", "new prompts that started from retained KV cells (hit rate = hits / lookups)"),
    "specserve_requests_finished_total": ("finished", "requests finished (stop or length)"),
    "specserve_requests_cancelled_total": ("cancelled", "requests cancelled by the client"),
    "specserve_drafter_errors_total": ("drafter_errors", "drafter failures (fell back to plain decoding)"),
    "specserve_preemptions_total": ("preemptions", "sequences preempted for lack of KV blocks (recomputed later)"),
    "specserve_memory_gamma_cuts_total": ("memory_gamma_cuts", "steps whose drafts were dropped for lack of KV blocks"),
    "specserve_drafter_parks_total": ("drafter_parks", "model drafters parked to give their memory to the KV pool"),
    "specserve_drafter_reloads_total": ("drafter_reloads", "model drafter reloads started"),
}
PHASES = ("prefill", "draft", "verify", "accept", "io", "step")
SEQUENCE_STATES = ("running", "waiting")  # specserve_sequences{state}: the autoscaler scales on waiting


@dataclass
class Iteration:
    """What the most recent iteration (admission + one step) did, as TensorRT-LLM's
    per-iteration statistics count it."""
    context_requests: int = 0  # sequences prefilled (new or recomputed after preemption)
    context_tokens: int = 0  # tokens those prefills computed
    generation_requests: int = 0  # sequences in the step's verify pass
    paused_requests: int = 0  # sequences preempted (sent back to the queue) this iteration
    timestamp_us: int = 0  # wall time the iteration ended, µs since the epoch


class StepStats:
    """Aggregates each StepOutcome on the service's thread; the publisher reads copies.

    `window` recent steps feed the acceptance-rate and mean-γ gauges (what the policy is
    doing now); the counters are cumulative, for Prometheus' rate()."""

    def __init__(self, service: Service, window: int = 256):
        self.service = service
        self._lock = threading.Lock()
        self.decisions = collections.Counter()  # (drafter, gamma) the policy planned, per sequence-step
        self.played = collections.Counter()  # gamma verified, per sequence-step
        self.recent = collections.deque(maxlen=window)  # (drafted, accepted, planned γ sum, played γ sum, sequences)
        self.iteration = Iteration(timestamp_us=int(time.time() * 1e6))
        self._seen = (0, 0, 0)  # LoopStats (prefills, prefill_tokens, preemptions) at the last outcome

    def observe(self, outcome) -> None:
        st = self.service.stats
        now = (st.prefills, st.prefill_tokens, st.preemptions)
        planned = [s.planned for s in outcome.sequences]
        with self._lock:
            for arm in planned:
                self.decisions[arm_labels(arm.drafter, arm.gamma)] += 1
            for s in outcome.sequences:
                self.played[s.gamma] += 1
            self.recent.append((outcome.drafted, outcome.accepted, sum(a.gamma for a in planned),
                                sum(s.gamma for s in outcome.sequences), len(outcome.sequences)))
            self.iteration = Iteration(context_requests=now[0] - self._seen[0], context_tokens=now[1] - self._seen[1],
                                       generation_requests=outcome.batch_size, paused_requests=now[2] - self._seen[2],
                                       timestamp_us=int(time.time() * 1e6))
            self._seen = now

    def snapshot(self):
        """(decisions, played, acceptance rate, mean planned γ, mean played γ, last iteration)."""
        with self._lock:
            decisions, played, recent, it = dict(self.decisions), dict(self.played), list(self.recent), self.iteration
        drafted, accepted, planned_sum, played_sum, seqs = (sum(col) for col in zip(*recent)) if recent else (0,) * 5
        return (decisions, played, accepted / drafted if drafted else 0.0,
                planned_sum / seqs if seqs else 0.0, played_sum / seqs if seqs else 0.0, it)


def arm_labels(drafter: Optional[str], gamma: int) -> tuple:
    """(drafter, gamma) label values of an arm; plain decoding is ("none", 0) however it is spelled."""
    return ("none", 0) if drafter is None or gamma <= 0 else (drafter, gamma)


class RequestLog:
    """Per-request facts the response senders report (any thread): error responses by reason,
    and each answered request's token counts and latencies (observed into histograms by the
    publisher). Latencies run from execute() receiving the request to its first / final response."""

    def __init__(self, maxlen: int = 100_000):
        self._lock = threading.Lock()
        self.rejected = collections.Counter()
        self.answers = collections.deque(maxlen=maxlen)  # (in tokens, out tokens, first s, total s), drained by publish

    def error(self, code: str) -> None:
        with self._lock:
            self.rejected[REJECT_REASONS.get(code, "internal")] += 1

    def answered(self, input_tokens: int, output_tokens: int, first_s: float = 0.0, total_s: float = 0.0) -> None:
        self.answers.append((input_tokens, output_tokens, first_s, total_s))  # deque.append is thread-safe


class EdgeRefusals:
    """Requests the HTTP edge answered with an error before they reached Triton, by (api, status,
    reason): api "openai" (/v1/...) or "triton" (the Triton HTTP protocol). The edge runs in the
    launcher's process and the metrics publisher in the model's, so the edge keeps its totals in
    `path` (JSON, replaced whole, at most every `flush_s`) and the publisher reads that file back.
    The totals outlive a Triton restart (the launcher's process keeps them)."""

    def __init__(self, path: Optional[str], flush_s: float = 0.2):
        self.path, self.flush_s = path, flush_s
        self.totals: collections.Counter = collections.Counter()
        self._pending = False

    def count(self, api: str, status: int, code: Optional[str] = None) -> None:
        self.totals[(api, str(status), code or EDGE_REASONS.get(status, "other"))] += 1
        if self.path is None or self._pending:
            return
        try:  # the edge's asyncio loop: one write per burst of refusals, off the request's path
            import asyncio
            asyncio.get_running_loop().call_later(self.flush_s, self.flush)
            self._pending = True
        except RuntimeError:  # no running loop (tests): write now
            self.flush()

    def flush(self) -> None:
        self._pending = False
        tmp = f"{self.path}.tmp"
        try:
            with open(tmp, "w") as f:
                json.dump([[*key, n] for key, n in self.totals.items()], f)
            os.replace(tmp, self.path)
        except OSError as e:
            log.warning("could not write the edge's refusal counts to %s: %r", self.path, e)


class EdgeRefusalsFile:
    """The publisher's side of EdgeRefusals: the totals in `path`, re-read only when it changed."""

    def __init__(self, path: Optional[str]):
        self.path, self._mtime, self._totals = path, None, {}

    def totals(self) -> dict:
        if not self.path:
            return {}
        try:
            st = os.stat(self.path)
            mtime = (st.st_ino, st.st_mtime_ns)  # each write replaces the file: a new inode
            if mtime != self._mtime:
                with open(self.path) as f:
                    self._totals = {(api, status, reason): int(n) for api, status, reason, n in json.load(f)}
                self._mtime = mtime
        except FileNotFoundError:  # nothing refused yet
            pass
        except (OSError, ValueError, TypeError) as e:
            log.warning("could not read the edge's refusal counts from %s: %r", self.path, e)
        return self._totals


class Family:
    """One metric family with the model/version labels on every series; series are created on
    first use. Triton's counters only increment, so `count_to` publishes a total's growth."""

    def __init__(self, pb, name: str, description: str, kind: str, base: dict, buckets=None):
        self.fam = pb.MetricFamily(name=name, description=description, kind=getattr(pb.MetricFamily, kind))
        self.base, self.buckets = base, buckets
        self.series, self.last = {}, {}

    def metric(self, **labels):
        key = tuple(sorted(labels.items()))
        m = self.series.get(key)
        if m is None:
            kw = {"labels": {**self.base, **{k: str(v) for k, v in labels.items()}}}
            if self.buckets is not None:
                kw["buckets"] = self.buckets
            m = self.series[key] = self.fam.Metric(**kw)
        return m

    def set(self, value, **labels) -> None:
        """Publishes only a changed value: each call is an IPC round trip to the server, and most
        gauges (max, tokens per block, drafter states...) rarely change."""
        key, value = tuple(sorted(labels.items())), float(value)
        if self.last.get(key) != value or key not in self.series:
            self.metric(**labels).set(value)
            self.last[key] = value

    def count_to(self, total, **labels) -> None:
        key = tuple(sorted(labels.items()))
        m, last = self.metric(**labels), self.last.get(key, 0)  # created at 0 so the series exists
        if total > last:
            m.increment(total - last)
            self.last[key] = total


class MetricsPublisher:
    """Publishes the service's state into Triton's Prometheus metrics (port --metrics-port)."""

    def __init__(self, service: Service, pb, model: str, version: str, requests: Optional[RequestLog] = None,
                 period_s: float = 0.5, start: bool = True, edge_refusals: Optional[str] = None):
        self.service, self.period_s = service, period_s
        self.requests = requests or RequestLog()
        self.edge_refusals = EdgeRefusalsFile(edge_refusals or os.environ.get(EDGE_REFUSALS_ENV))
        self.steps = StepStats(service)
        service.add_outcome_listener(self.steps.observe)
        base = {"model": model, "version": str(version)}

        def family(name, description, kind="GAUGE", buckets=None):
            return Family(pb, name, description, kind, base, buckets)

        # NVIDIA's families (names, label keys and help texts as TensorRT-LLM's backend publishes them)
        self.trt_request = family("nv_trt_llm_request_metrics", "TRT LLM request metrics")
        self.trt_memory = family("nv_trt_llm_runtime_memory_metrics", "TRT LLM runtime memory metrics")
        self.trt_kv = family("nv_trt_llm_kv_cache_block_metrics", "TRT LLM KV cache block metrics")
        self.trt_ifb = family("nv_trt_llm_inflight_batcher_metrics", "TRT LLM inflight_batcher-specific metrics")
        self.trt_general = family("nv_trt_llm_general_metrics", "General TRT LLM metrics")
        self.input_len = family("nv_llm_input_token_len", "TRT LLM response metrics", "HISTOGRAM", TOKEN_LEN_BUCKETS)
        self.output_len = family("nv_llm_output_token_len", "TRT LLM response metrics", "HISTOGRAM", TOKEN_LEN_BUCKETS)
        # Triton 2.51 has no latency for a decoupled model beyond execute() returning (admission)
        self.first_response = family("specserve_time_to_first_response_seconds",
                                     "request received -> first response (streaming: first tokens; else the answer)",
                                     "HISTOGRAM", LATENCY_BUCKETS)
        self.duration = family("specserve_request_duration_seconds", "request received -> final response",
                               "HISTOGRAM", LATENCY_BUCKETS)
        # ours
        self.counters = {field: family(name, help_, "COUNTER") for name, (field, help_) in COUNTERS.items()}
        self.phases = family("specserve_phase_seconds_total", "engine-loop wall time by phase (step = whole steps)",
                             "COUNTER")
        self.sequences = family(name="specserve_sequences",
                                description="sequences by state (running hold a batch slot and KV cache)")
        self.kv_blocks = family("specserve_kv_blocks",
                                "KV cache blocks (16 tokens) by state: free, total, and retained (finished requests' cells "
                                "kept for reuse, given up when needed); the pool grows when a drafter is parked")
        self.acceptance = family("specserve_acceptance_rate",
                                 "accepted / verified draft tokens over the last 256 steps (0 when none drafted)")
        self.gamma_mean = family("specserve_gamma_mean",
                                 "mean draft length per sequence-step over the last 256 steps: the policy's plan "
                                 "(arm=planned) and what the target verified (arm=played)")
        self.decisions = family("specserve_decisions_total",
                                "the policy's decision per sequence-step, by arm (drafter none = plain decoding)",
                                "COUNTER")
        self.gamma_played = family("specserve_gamma_played_total",
                                   "sequence-steps by the number of draft tokens the target verified", "COUNTER")
        self.drafter_state = family("specserve_drafter_state",
                                    "1 for each drafter's current state: resident, parked (weights given to the "
                                    "KV pool) or reloading")
        self.rejected = family("specserve_requests_rejected_total",
                               "requests answered with an error: invalid (400), unavailable (503: overloaded "
                               "or shutting down), internal (500)",
                               "COUNTER")
        self.edge_refused = family("specserve_edge_requests_refused_total",
                                   "requests the HTTP edge answered with an error before they reached Triton, by "
                                   "api (openai, triton), HTTP status and reason", "COUNTER")
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="metrics", daemon=True)
        if start:
            self.thread.start()

    def publish(self) -> None:
        service, st = self.service, self.service.stats
        for field, fam in self.counters.items():
            fam.count_to(getattr(st, field))  # COUNTERS names LoopStats fields
        for ph in PHASES:
            self.phases.count_to(getattr(st, f"{ph}_time_s"), phase=ph)
        running, waiting = len(service.running), service.queue_depth
        for state, value in zip(SEQUENCE_STATES, (running, waiting)):
            self.sequences.set(value, state=state)
        pool = service.pool
        total, free = pool.num_blocks, pool.num_free
        self.kv_blocks.set(free, state="free")
        self.kv_blocks.set(total, state="total")
        self.kv_blocks.set(pool.num_retained, state="retained")

        decisions, played, acceptance, planned_mean, played_mean, it = self.steps.snapshot()
        # Per-iteration figures describe the iteration in progress: none while the service is idle.
        busy = it if running else Iteration(timestamp_us=it.timestamp_us)
        for label, value in (("active", running), ("max", service.max_batch), ("waiting", waiting),
                             ("scheduled", busy.generation_requests), ("context", busy.context_requests)):
            self.trt_request.set(value, request_type=label)
        for label, value in (("cpu", rss_bytes()), ("gpu", 0), ("pinned", 0)):
            self.trt_memory.set(value, memory_type=label)
        for label, value in (("max", total), ("free", free), ("used", total - free), ("tokens_per", pool.block_size),
                             ("reused", st.kv_blocks_reused), ("fraction", (total - free) / total if total else 0.0)):
            self.trt_kv.set(value, kv_cache_block_type=label)
        for label, value in (("total_context_tokens", busy.context_tokens),
                             ("generation_requests", busy.generation_requests),
                             ("micro_batch_id", 0), ("paused_requests", busy.paused_requests)):
            self.trt_ifb.set(value, inflight_batcher_specific_metric=label)
        self.trt_general.set(st.steps, general_type="iteration_counter")
        self.trt_general.set(it.timestamp_us, general_type="timestamp")

        self.acceptance.set(acceptance)
        self.gamma_mean.set(planned_mean, arm="planned")
        self.gamma_mean.set(played_mean, arm="played")
        for (drafter, gamma), n in decisions.items():
            self.decisions.count_to(n, drafter=drafter, gamma=gamma)
        for gamma, n in played.items():
            self.gamma_played.count_to(n, gamma=gamma)
        for name, d in service.drafters.items():
            state = "reloading" if d.reloading else "resident" if d.resident else "parked"
            for s in ("resident", "parked", "reloading"):
                self.drafter_state.set(int(s == state), drafter=name, state=s)
        with self.requests._lock:
            rejected = dict(self.requests.rejected)
        for reason in REJECT_REASONS.values():
            self.rejected.count_to(rejected.get(reason, 0), reason=reason)
        for (api, status, reason), n in self.edge_refusals.totals().items():
            self.edge_refused.count_to(n, api=api, status=status, reason=reason)
        answers = self.requests.answers
        while answers:
            n_in, n_out, first_s, total_s = answers.popleft()
            self.input_len.metric(response_metric_type="total_input_tokens").observe(float(n_in))
            self.output_len.metric(response_metric_type="total_output_tokens").observe(float(n_out))
            self.first_response.metric().observe(first_s)
            self.duration.metric().observe(total_s)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.publish()
            except Exception:
                log.exception("publishing metrics failed")

    def stop(self) -> None:
        self._stop.set()
        if self.thread.is_alive():
            self.thread.join(2)


def rss_bytes() -> int:
    """Resident memory of this process (the model's Python stub: engine, KV cache, drafters)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
