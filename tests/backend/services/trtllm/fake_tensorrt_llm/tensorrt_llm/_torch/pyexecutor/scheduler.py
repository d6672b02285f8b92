"""tensorrt_llm/_torch/pyexecutor/scheduler.py (fake): ScheduledRequests."""
from __future__ import annotations

from ... import _fake


@_fake.stands_for("tensorrt_llm._torch.pyexecutor.scheduler.ScheduledRequests")
class ScheduledRequests:
    def __init__(self):
        self.context_requests = []
        self.generation_requests = []
        self.paused_requests = []

    @property
    def batch_size(self) -> int:
        return len(self.context_requests) + len(self.generation_requests)

    def all_requests(self):
        return self.context_requests + self.generation_requests
