"""tensorrt_llm/llmapi/llm.py + executor/result.py (fake): LLM.generate_async streams a
RequestOutput (a GenerationResult) whose outputs[0] is a CompletionOutput. The fake
executor (tests/backend/services/trtllm/fake_executor.py) runs the iterations: each `__anext__`
steps it until this request has new tokens."""
from __future__ import annotations

import asyncio
from typing import List, Optional

from .. import _fake
from .._torch.speculative.drafter import Drafter
from ..sampling_params import SamplingParams
from .llm_args import UserProvidedDecodingConfig


@_fake.stands_for("tensorrt_llm.executor.result.CompletionOutput")
class CompletionOutput:
    def __init__(self, index: int = 0):
        self.index, self.text, self.token_ids = index, "", []
        self.finish_reason: Optional[str] = None
        self._last_token_ids_len = 0

    @property
    def length(self) -> int:
        return len(self.token_ids)

    @property
    def token_ids_diff(self) -> List[int]:
        return self.token_ids[self._last_token_ids_len:]


@_fake.stands_for("tensorrt_llm.llmapi.llm.RequestOutput")
class RequestOutput:
    def __init__(self, executor, request_id: int, prompt_token_ids: List[int]):
        self._executor, self._rid = executor, request_id
        self.prompt_token_ids = prompt_token_ids
        self.outputs = [CompletionOutput(0)]
        self._done = self._aborted = False

    @property
    def request_id(self) -> int:
        return self._rid

    @property
    def finished(self) -> bool:
        return self._done

    def abort(self) -> None:
        self._executor.abort(self._rid)
        self._aborted = True

    def aborted(self) -> bool:
        return self._aborted

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self._done or self._aborted:
            raise StopAsyncIteration
        out = self.outputs[0]
        out._last_token_ids_len = len(out.token_ids)
        while True:
            r = self._executor.request(self._rid)
            if len(r.generated) > len(out.token_ids) or r.finish_reason is not None:
                break
            if not self._executor.step() and self._executor.request(self._rid).finish_reason is None:
                raise RuntimeError(f"request {self._rid} is not running")
            await asyncio.sleep(0)
        out.token_ids = list(r.generated)
        if r.finish_reason is not None:
            out.finish_reason, self._done = r.finish_reason, True
        return _fake.record(self)


class LLM:
    def __init__(self, model: str, *, backend: Optional[str] = None, skip_tokenizer_init: bool = False,
                 speculative_config: Optional[UserProvidedDecodingConfig] = None, kv_cache_config=None,
                 max_batch_size: Optional[int] = None, max_seq_len: Optional[int] = None,
                 max_num_tokens: Optional[int] = None, disable_overlap_scheduler: bool = False,
                 cuda_graph_config=None, tensor_parallel_size: int = 1, enable_iter_perf_stats: bool = False,
                 guided_decoding_backend: Optional[str] = None):
        self.args = dict(model=model, backend=backend, skip_tokenizer_init=skip_tokenizer_init,
                         speculative_config=speculative_config, kv_cache_config=kv_cache_config,
                         max_batch_size=max_batch_size, max_seq_len=max_seq_len, max_num_tokens=max_num_tokens,
                         disable_overlap_scheduler=disable_overlap_scheduler, cuda_graph_config=cuda_graph_config,
                         tensor_parallel_size=tensor_parallel_size, enable_iter_perf_stats=enable_iter_perf_stats,
                         guided_decoding_backend=guided_decoding_backend)
        if guided_decoding_backend not in (None, "xgrammar", "llguidance"):
            raise ValueError(f"Unsupported guided decoding backend {guided_decoding_backend}")
        # upstream get_guided_decoding_config: `assert tokenizer is not None` (none when skip_tokenizer_init)
        assert guided_decoding_backend is None or not skip_tokenizer_init
        # upstream speculative/utils.py get_spec_drafter: `if spec_config.spec_dec_mode.is_user_provided(): return spec_config.drafter`
        self.drafter = speculative_config.drafter if speculative_config is not None else None
        if self.drafter is not None and not isinstance(self.drafter, Drafter):
            raise TypeError("UserProvidedDecodingConfig.drafter must be a Drafter")
        if _fake.EXECUTOR_FACTORY is None:
            raise RuntimeError("the fake tensorrt_llm has no executor (install it with the fake_trtllm fixture)")
        self._executor = _fake.EXECUTOR_FACTORY(self)
        self.shut_down = False

    def generate_async(self, inputs, sampling_params: Optional[SamplingParams] = None, streaming: bool = False):
        sp = sampling_params or SamplingParams()
        if not (isinstance(inputs, list) and all(isinstance(t, int) for t in inputs)):
            raise TypeError("this fake takes prompt token ids (the adapter skips TensorRT-LLM's tokenizer)")
        rid = self._executor.submit(list(inputs), sp)
        return _fake.record(RequestOutput(self._executor, rid, list(inputs)))

    def generate(self, inputs, sampling_params: Optional[SamplingParams] = None):
        """Every prompt (token-id lists) to its end, as a list of finished RequestOutputs."""
        outs = [self.generate_async(p, sampling_params) for p in inputs]
        while self._executor.step():
            pass
        for o in outs:
            o.outputs[0].token_ids = list(self._executor.request(o.request_id).generated)
            o._done = True
        return outs

    def shutdown(self) -> None:
        self.shut_down = True
