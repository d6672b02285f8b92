"""The service contract: what the front ends drive and read of whatever serves the requests.

A *service* takes GenerationRequests and streams their responses to sinks, from a thread
of its own. Two implement this contract: our EngineLoop (backend/loop/engine_loop.py, on an
engine of backend/engines/) and TrtllmService (backend/services/trtllm/serving.py, on
TensorRT-LLM, which owns its loop). The front ends use these members and nothing else, with no
probing for optional ones:

    the Triton adapter (backend/frontend/triton_models/model.py)   submit, start, stop, limits (checks a whole
                                                      batch before any row starts); DrainWatcher:
                                                      drain, idle
    the metrics publisher (backend/frontend/metrics.py)        stats, running, queue_depth, pool,
                                                      max_batch, drafters, add_outcome_listener

tests/backend/services/test_contract.py checks both services against it (members and signatures) and
the front ends for probing. An engine is a different thing: the target model behind our loop,
with its own contract (backend/engines/contract.py) and test suite.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Mapping, Protocol, Sized, runtime_checkable

if TYPE_CHECKING:
    from policy import StepOutcome

    from ..loop.stats import LoopStats
    from ..generation.request import GenerationRequest, Limits
    from ..generation.sequence import ResponseSink


@runtime_checkable
class KvPoolView(Protocol):
    """The KV cache as the metrics read it (backend/kv_blocks.BlockPool; TensorRT-LLM's KvPool)."""

    @property
    def num_blocks(self) -> int: ...

    @property
    def num_free(self) -> int: ...

    @property
    def block_size(self) -> int: ...  # tokens per block

    @property
    def num_retained(self) -> int: ...  # in use by cells kept for later prompts (given up when needed)


@runtime_checkable
class DrafterView(Protocol):
    """A drafter's residency as the metrics read it (backend/drafters/base.Drafter)."""

    @property
    def resident(self) -> bool: ...  # usable now

    @property
    def reloading(self) -> bool: ...  # a model drafter's weights coming back after a park


@runtime_checkable
class Service(Protocol):
    """What serves requests. See the module docstring; members are read from any thread."""

    # -- requests ----------------------------------------------------------------------------
    def submit(self, req: GenerationRequest, sink: ResponseSink) -> int:
        """Admit `req` and queue it; -> its sequence id. Raises before anything starts when refused:
        RequestError (the client's mistake), Overloaded (queue full), ShuttingDown (draining)."""
        ...

    @property
    def limits(self) -> Limits:
        """What a request may ask for (max_tokens, max_context): backend.generation.request.validate checks
        a request against it without submitting it."""
        ...

    # -- lifetime ----------------------------------------------------------------------------
    def start(self) -> None:
        """Start serving (the service's own thread); after the metrics publisher has hooked in."""
        ...

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving; requests still in flight get a final error, never left hanging."""
        ...

    def drain(self, seconds: float) -> None:
        """Shutdown begins: refuse new requests at once, let those in flight run for `seconds`,
        then end the rest with a final error."""
        ...

    @property
    def idle(self) -> bool:
        """Nothing in flight (running, waiting or submitted)."""
        ...

    # -- what it reports (backend/frontend/metrics.py) ------------------------------------------------
    @property
    def stats(self) -> LoopStats:
        """Cumulative counters and phase times (backend/loop/stats.py)."""
        ...

    @property
    def max_batch(self) -> int:
        """Sequences that can run at once."""
        ...

    @property
    def running(self) -> Sized:
        """The sequences running now (only its length is read)."""
        ...

    @property
    def queue_depth(self) -> int:
        """Requests admitted but not running yet."""
        ...

    @property
    def pool(self) -> KvPoolView:
        """The target's KV cache blocks."""
        ...

    @property
    def drafters(self) -> Mapping[str, DrafterView]:
        """The drafters by name."""
        ...

    def add_outcome_listener(self, listener: Callable[[StepOutcome], None]) -> None:
        """Call `listener(outcome)` after every closed step, on the thread that closed it."""
        ...
