"""Server configuration: config.pbtxt parameters, overridable by SPECSERVE_* env vars.

Every key below can be set in model_repository/llm/config.pbtxt `parameters` or as
an environment variable SPECSERVE_<KEY upper-case> (env wins), so tests and users
change the served model, dtype or policy without editing files.
"""
from __future__ import annotations

import difflib
import logging
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import List, Mapping, Optional

log = logging.getLogger("specserve")


ENGINES = ("llama.cpp", "torch", "trtllm")


@dataclass(frozen=True)
class ServerConfig:
    checkpoint: str = ".cache/models/smollm2-135m-instruct"  # any local HF Llama-family dir
    engine: str = "llama.cpp"  # llama.cpp (CPU default) | torch (exact reference, hosts model drafters) | trtllm (GPU; not yet run on one)
    dtype: str = "bf16"  # torch engine: bf16 | fp32
    batch_invariant: bool = True  # torch engine, bf16: logits bit-identical whatever the batch (1.3-2.4x slower steps)
    gguf: str = ""  # llama.cpp engine: the GGUF file; "" = the one the checkpoint's manifest names (build_engines/prepare_gguf.py)
    kv_type: str = "q8_0"  # llama.cpp engine's KV cache type: q8_0 | bf16 (batch-invariant) | f16 (not batch-invariant)
    max_batch: int = 32  # running sequences per model instance
    max_context: int = 2048  # prompt + output tokens per sequence
    max_tokens_limit: int = 1024  # largest max_tokens a request may ask for (Limits.max_new_tokens_limit)
    default_max_tokens: int = 64  # when a request does not send max_tokens (max_new_tokens applies it)
    threads: int = 0  # engine threads (torch intra-op, llama.cpp); 0 = all cores
    # the policy: a registered name (see policy/), or a YAML file naming one with its parameters
    # (configs/policies/*.yaml); the launcher checks it (backend/served.py)
    policy: str = "composite"
    drafters: str = "ngram,suffix,grammar"  # comma-separated: registered drafters, or model drafters found in drafter_dir
    drafter_dir: str = ".cache/drafters"  # model drafter <name> is <drafter_dir>/<name>-drafter[-quick]
    kv_budget_mb: int = 0  # target KV cache + resident model drafters; 0 = room for max_batch full contexts
    chat_template_default: bool = False  # apply the chat template when the request does not say
    tpot_slo_ms: int = 0  # time-per-output-token target given to SLO-aware policies; 0 = none
    trace_file: str = ""  # append every StepOutcome as a JSON line (replay: python -m policy.simulator)
    # admission control (issue 20): waiting requests beyond which new ones get "overloaded, retry later"
    max_queue: int = 0  # 0 = 4 x max_batch
    # chunked prefill (issue 20): prompt tokens prefilled per iteration, between decode steps; 0 = whole prompts
    prefill_chunk: int = 128
    # chunks of prefill_chunk an iteration prefills when that many prompts are waiting for theirs
    # (one a prompt), or one prompt alone while nothing decodes: a loaded server amortises the
    # decode step over more prompt tokens (issue 30), an idle one reads the weights fewer times
    prefill_chunks: int = 4
    async_send: bool = True  # send responses from a thread of their own, overlapping the next step
    # llama.cpp: copy the chat template's shared first tokens instead of prefilling them. Off by default:
    # each copy writes a whole 2,048-cell stream, so RSS grows towards the full KV allocation
    # (+57 MiB in the 60 s soak test, bounded, but indistinguishable from a leak there).
    reuse_prefix: bool = False
    # llama.cpp: KV streams keeping the cells of finished requests; a prompt that starts with the same
    # tokens (a chat's next turn, a resent document) copies the longest shared prefix instead of
    # prefilling it (bit-identical; backend/loop/retained.py). 0 = no reuse across requests.
    kv_reuse_streams: int = 8
    # engine trtllm (GPU; not yet run on one): TensorRT-LLM's tensor parallelism over this many GPUs
    tensor_parallel_size: int = 1
    # engine trtllm: the LLM-API settings file (build_engines/prepare_trtllm.py writes it);
    # "" = <checkpoint>/trtllm/llm_api.yaml when it exists, else settings derived from this config
    trtllm_config: str = ""

    @classmethod
    def load(cls, params: Mapping[str, str], env: Mapping[str, str] = os.environ) -> "ServerConfig":
        params, values = _one_policy_key(params, env), {}
        for f in fields(cls):
            raw = env.get("SPECSERVE_" + f.name.upper(), params.get(f.name))
            if raw is None or raw == "":
                continue
            if f.type in ("int", int):
                values[f.name] = int(raw)
            elif f.type in ("bool", bool):
                values[f.name] = str(raw).lower() in ("1", "true", "yes", "on")
            else:
                values[f.name] = str(raw)
        for message in unknown_env(env):
            log.warning(message)
        unknown = set(params) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown config parameters: {', '.join(sorted(unknown))}")
        cfg = cls(**values)
        if cfg.engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {cfg.engine!r}")
        if cfg.dtype not in ("bf16", "fp32"):
            raise ValueError(f"dtype must be bf16 or fp32, got {cfg.dtype!r}")
        if cfg.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {cfg.tensor_parallel_size}")
        if cfg.tensor_parallel_size > 1 and cfg.engine != "trtllm":
            raise ValueError(f"tensor_parallel_size {cfg.tensor_parallel_size} needs engine trtllm "
                             f"(the {cfg.engine} engine runs on one device)")
        return cfg

    def policy_file(self) -> bool:
        """Whether `policy` names a YAML file (else a registered policy's name)."""
        return self.policy.endswith((".yaml", ".yml")) or "/" in self.policy

    def max_new_tokens(self, sent: Optional[int]) -> int:
        """A request's length: the max_tokens it sent, else this server's default. The one place the
        default applies (Triton's models and the OpenAI API both ask here); checked against
        max_tokens_limit once, by generation/request.validate."""
        return self.default_max_tokens if sent is None else sent

    def resolve(self, path: str, root: Path) -> Path:
        p = Path(path)
        return p if p.is_absolute() else root / p


# The policy file's former key: read still (a config or a script may set it), but never beside `policy`
FORMER_POLICY_KEY = "policy_config"


def _one_policy_key(params: Mapping[str, str], env: Mapping[str, str]) -> dict:
    """params with the former policy_config folded into policy, the one policy key; ValueError
    when both name a policy (one of them would be silently ignored: which one serves?)."""
    params = dict(params)
    former = env.get("SPECSERVE_POLICY_CONFIG", params.pop(FORMER_POLICY_KEY, None))
    params.pop(FORMER_POLICY_KEY, None)
    if not former:
        return params
    named = [f"{where} {value!r}" for where, value in (("SPECSERVE_POLICY", env.get("SPECSERVE_POLICY")),
                                                      ("the served config's policy", params.get("policy"))) if value]
    if named:
        source = "SPECSERVE_POLICY_CONFIG" if env.get("SPECSERVE_POLICY_CONFIG") else "the served config's policy_config"
        raise ValueError(f"two policies are named: {named[0]} and {source} {former!r}; set one, policy (a name or "
                         f"a YAML file; policy_config is its former name for a file)")
    params["policy"] = former
    return params


# SPECSERVE_* variables read by the code that are not ServerConfig keys (each in the README's tables).
OTHER_ENV = {
    "SPECSERVE_POLICY_CONFIG": "the former name of SPECSERVE_POLICY for a policy file: read, never beside it",
    "SPECSERVE_ROOT": "project root Triton's model.py imports from (the launcher sets it)",
    "SPECSERVE_ADMIN_KEY": "the launcher: the key that opens Triton's restricted HTTP APIs",
    "SPECSERVE_BIND_ADDRESS": "the launcher: the address the edge, gRPC and metrics listen on",
    "SPECSERVE_MAX_BODY_BYTES": "the launcher: the largest HTTP body",
    "SPECSERVE_MAX_JSON_DEPTH": "the launcher: the deepest JSON nesting",
    "SPECSERVE_DRAIN_SECONDS": "the launcher: in-flight requests' time to finish at shutdown",
    "SPECSERVE_MAX_RESTARTS": "the launcher: give up after that many Triton restarts within 10 minutes (0: never)",
    "SPECSERVE_RESTART_BACKOFF_MAX_S": "the launcher: the longest wait before a Triton restart (1, 2, 4 ... up to it)",
    "SPECSERVE_HTTP_READ_TIMEOUT_S": "the launcher: seconds an HTTP client has to send headers, and its body",
    "SPECSERVE_START_TIMEOUT_S": "the launcher: seconds a starting Triton has to become ready before it is restarted",
    "SPECSERVE_PARENT_PID": "the launcher tells Triton (argv_env.c) the process whose death kills it",
    "SPECSERVE_SERVED": "the launcher tells Triton's models the file holding the served config it resolved",
    "SPECSERVE_CANCEL_DIR": "the launcher tells the model where the edge marks cancelled requests",
    "SPECSERVE_DRAIN_FILE": "the launcher tells the model the file that says it is draining",
    "SPECSERVE_EDGE_REFUSALS": "the launcher tells the model the file holding the edge's refusal counts",
    "SPECSERVE_BUILD_ON_DEMAND": "the launcher: build what the served config names before serving",
    "SPECSERVE_DRAFTER_PRESET": "builds of model drafters: quick or full",
    "SPECSERVE_PROFILE_BUDGET_S": "seconds a step-time profile may take",
    "SPECSERVE_AUTO_PREPARE": "the container entrypoint: prepare the model cache before serving",
    "SPECSERVE_GGUF_DIR": "the container entrypoint: where the image keeps the GGUF it converts",
    "SPECSERVE_PREPARE_DRAFTERS": "the container entrypoint: model drafters to build when preparing",
    "SPECSERVE_Q8_MATMUL": "llama.cpp's CPU backend: 0 gives every matmul and attention back to the stock kernels",
    "SPECSERVE_Q8_LANES": "llama.cpp's CPU backend on AVX-512 VNNI: 0 keeps llama.cpp's order of sums (no rows-in-lanes copies)",
    "SPECSERVE_TRTLLM_MODEL": "the gpu-marked tests: a local Hugging Face model for TensorRT-LLM",
    "SPECSERVE_CACHE": "docker compose: the cache volume or directory",
    "SPECSERVE_MODEL": "docker compose: the model directory under models/",
    "SPECSERVE_PUBLISH_ADDRESS": "docker compose: the host address the ports are published on",
}
# Kubernetes service links (SPECSERVE_SERVICE_HOST, SPECSERVE_PORT_8000_TCP, ...) name a Service, not a
# setting; SPECSERVE_ARG_<NAME> carry Triton's secret arguments from the launcher (argv_env.c) and no one else.
SERVICE_LINK_PREFIXES = ("SPECSERVE_SERVICE_", "SPECSERVE_PORT", "SPECSERVE_ARG_")


def known_env() -> List[str]:
    """Every SPECSERVE_* variable the project reads: one per ServerConfig key, and OTHER_ENV."""
    return sorted({"SPECSERVE_" + f.name.upper() for f in fields(ServerConfig)} | set(OTHER_ENV))


def unknown_env(env: Mapping[str, str] = os.environ) -> List[str]:
    """A warning for each SPECSERVE_* variable nothing reads (a misspelt one would be silently
    ignored), naming the closest known one.

    >>> unknown_env({"SPECSERVE_MAX_BACH": "8", "SPECSERVE_MAX_BATCH": "8", "HOME": "/root"})
    ['SPECSERVE_MAX_BACH is not a setting of this server and is ignored; did you mean SPECSERVE_MAX_BATCH?']
    """
    known = known_env()
    out = []
    for name in sorted(env):
        if not name.startswith("SPECSERVE_") or name in known or name.startswith(SERVICE_LINK_PREFIXES):
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        out.append(f"{name} is not a setting of this server and is ignored"
                   + (f"; did you mean {close[0]}?" if close else " (the README lists every SPECSERVE_* variable)"))
    return out
