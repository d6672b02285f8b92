"""A fake `tensorrt_llm`, shaped after TensorRT-LLM 1.2.x: only the names our adapter
(backend/services/trtllm) uses, with the upstream signatures recorded in
tests/backend/services/trtllm/upstream_api.json. Installed into sys.modules by the `fake_trtllm`
fixture; never importable otherwise. Objects handed to the adapter pass through
`_fake.record`, which logs every attribute the adapter touches."""
from .llmapi import LLM
from .sampling_params import SamplingParams

__version__ = "1.2.1+fake"
