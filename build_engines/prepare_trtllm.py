"""Prepare what the TensorRT-LLM path needs ahead of time. NOT YET RUN ON A GPU.

There is no engine to build: TensorRT-LLM's PyTorch backend loads a Hugging Face checkpoint
directory directly (docs/trtllm.md, "Offline preparation"). What is prepared:

1. the target checkpoint in that form: checked (config, weights, tokenizer), and optionally a
   quantized variant the way TensorRT-LLM documents it for this backend: NVIDIA ModelOpt
   post-training quantization exported as a unified Hugging Face checkpoint
   (`mtq.quantize(model, mtq.FP8_DEFAULT_CFG, forward_loop)`, then `export_hf_checkpoint`,
   which writes `hf_quant_config.json`; TensorRT-LLM reads that file when it loads the
   directory). ModelOpt ships in NVIDIA's TensorRT-LLM images; calibration wants the GPU;
   the calibration text is local (`--calib-file`, else a built-in set): nothing is downloaded;
2. the LLM-API settings the server reads, `<served>/trtllm/llm_api.yaml` (KV-cache fraction,
   block reuse, max batch, max sequence length, tensor parallelism, iteration statistics on;
   backend/services/trtllm/llm_config.py);
3. the drafters: model-free ones need nothing; model drafters are found in --drafter-dir (or
   distilled there with --build-drafters) and checked against the target's vocabulary;
4. `<served>/trtllm/manifest.json`: the TensorRT-LLM version it is written for and the one
   installed here (if any), the checkpoint, its quantization, the settings file, the drafters.

    python -m build_engines.prepare_trtllm --checkpoint .cache/models/smollm2-135m-instruct
    python -m build_engines.prepare_trtllm --checkpoint /cache/models/Llama-3.1-8B-Instruct --quantize fp8 \\
        --max-batch 64 --max-context 8192 --drafters ngram,suffix
    # then serve the quantized directory: SPECSERVE_CHECKPOINT=/cache/models/Llama-3.1-8B-Instruct-fp8
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from backend.services.trtllm import _api, llm_config
from backend.server_config import ServerConfig

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = llm_config.MANIFEST
# --quantize -> the ModelOpt config (modelopt.torch.quantization); TensorRT-LLM's PyTorch backend runs
# both from ModelOpt checkpoints (FP8: Hopper, Ada, Blackwell; NVFP4: Blackwell; docs/source/features/quantization.md)
QUANT_CONFIGS = {"fp8": "FP8_DEFAULT_CFG", "nvfp4": "NVFP4_DEFAULT_CFG"}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "chat_template.jinja", "generation_config.json")
CALIB_TEXT = [  # a few varied lines; pass --calib-file with text like the served traffic for a better FP8 scale
    "The capital of France is Paris, and the capital of Italy is Rome.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "Summarise the following paragraph in one sentence: the meeting was moved to Thursday because",
    "User: How do I reverse a list in Python?\nAssistant: Use slicing, my_list[::-1], or my_list.reverse().",
    "1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233",
    "Once upon a time, in a village at the edge of a forest, there lived an old clockmaker who",
]


def log(msg: str) -> None:
    print(f"[prepare_trtllm] {msg}", flush=True)


def check_checkpoint(ckpt: Path) -> dict:
    """The Hugging Face directory TensorRT-LLM loads: config, safetensors weights, tokenizer."""
    if not (ckpt / "config.json").exists():
        raise SystemExit(f"{ckpt}: no config.json; a Hugging Face checkpoint directory is needed")
    if not any(ckpt.glob("*.safetensors")):
        raise SystemExit(f"{ckpt}: no *.safetensors weights")
    if not (ckpt / "tokenizer.json").exists() and not (ckpt / "tokenizer.model").exists():
        raise SystemExit(f"{ckpt}: no tokenizer (the server tokenizes with the checkpoint's own)")
    return json.loads((ckpt / "config.json").read_text())


def quantization(ckpt: Path):
    """What hf_quant_config.json (ModelOpt's unified export) says, or None for an unquantized checkpoint."""
    f = ckpt / "hf_quant_config.json"
    return json.loads(f.read_text()).get("quantization") if f.exists() else None


def quantize(ckpt: Path, out: Path, scheme: str, calib: list, device: str) -> None:
    """ModelOpt PTQ, exported as a unified HF checkpoint (hf_quant_config.json) into `out`."""
    try:
        import modelopt.torch.quantization as mtq
        from modelopt.torch.export import export_hf_checkpoint
    except ImportError:
        raise SystemExit("--quantize needs NVIDIA ModelOpt (nvidia-modelopt), which NVIDIA's TensorRT-LLM images "
                         "ship: run this inside docker/Dockerfile.trtllm's image") from None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ckpt)
    model = AutoModelForCausalLM.from_pretrained(ckpt, torch_dtype="auto").to(device).eval()

    def forward_loop(m) -> None:
        with torch.no_grad():
            for text in calib:
                m(tok(text, return_tensors="pt").input_ids.to(device))

    log(f"quantizing {ckpt.name} to {scheme} with ModelOpt ({len(calib)} calibration texts on {device})")
    model = mtq.quantize(model, getattr(mtq, QUANT_CONFIGS[scheme]), forward_loop)
    tmp = out.with_name(out.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    with torch.inference_mode():
        export_hf_checkpoint(model, export_dir=tmp)
    for name in TOKENIZER_FILES:  # the server tokenizes with the served directory's own tokenizer
        if (ckpt / name).exists() and not (tmp / name).exists():
            shutil.copy2(ckpt / name, tmp / name)
    if quantization(tmp) is None:
        raise SystemExit(f"ModelOpt wrote no hf_quant_config.json into {tmp}; TensorRT-LLM would load it unquantized")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def drafter_entries(names: list, target: dict, drafter_dir: Path, target_ckpt: Path, build: str) -> list:
    """One manifest entry per drafter; model drafters found (or distilled) and checked."""
    from backend.drafters import DRAFTERS
    from backend.drafters.feature import is_feature_drafter
    from backend.drafters.artifacts import find_artifact

    entries = []
    for name in names:
        if name in DRAFTERS and not DRAFTERS[name].is_model:
            entries.append({"name": name, "kind": "model-free"})
            continue
        path = find_artifact(drafter_dir, name)
        if path is None and build:
            log(f"distilling drafter {name} ({build} preset)")
            subprocess.run([sys.executable, "-m", "build_engines.distill_drafter", "--domain", name, "--preset", build,
                            "--target", str(target_ckpt), "--out", str(drafter_dir)], cwd=ROOT, check=True)
            path = find_artifact(drafter_dir, name)
        if path is None:
            raise SystemExit(f"model drafter {name!r} not in {drafter_dir} (build it: --build-drafters quick|full, "
                             f"or python -m build_engines.distill_drafter --domain {name})")
        if is_feature_drafter(path):
            raise SystemExit(f"drafter {name!r} reads the target's hidden states; TensorRT-LLM's drafter hook has none")
        vocab = json.loads((path / "config.json").read_text()).get("vocab_size")
        if vocab != target.get("vocab_size"):
            raise SystemExit(f"drafter {name!r} has vocabulary {vocab}, the target {target.get('vocab_size')}")
        weights = sum(f.stat().st_size for f in path.glob("*.safetensors"))
        entries.append({"name": name, "kind": "model", "path": str(path), "weight_bytes": weights})
    return entries


def prepare(args) -> Path:
    ckpt = args.checkpoint.resolve()
    target = check_checkpoint(ckpt)
    served = ckpt
    if args.quantize:
        if quantization(ckpt):
            raise SystemExit(f"{ckpt} is already quantized ({quantization(ckpt)}); serve it as it is")
        served = (args.out or ckpt.with_name(f"{ckpt.name}-{args.quantize}")).resolve()
        if quantization(served) and not args.force:
            log(f"{served} already holds a quantized checkpoint ({quantization(served)['quant_algo']})")
        else:
            calib = args.calib_file.read_text().split("\n\n") if args.calib_file else CALIB_TEXT
            quantize(ckpt, served, args.quantize, [t for t in calib if t.strip()][: args.calib_samples], args.device)
        check_checkpoint(served)
    cfg = ServerConfig(checkpoint=str(served), max_batch=args.max_batch, max_context=args.max_context,
                       tensor_parallel_size=args.tensor_parallel_size, kv_budget_mb=args.kv_budget_mb)
    settings = llm_config.default_settings(cfg, served, free_gpu_memory_fraction=args.kv_fraction,
                                           enable_block_reuse=not args.no_block_reuse)
    config_file = served / llm_config.FILE
    llm_config.write(config_file, settings, header=(
        "LLM-API settings of the TensorRT-LLM path (build_engines/prepare_trtllm.py; read by\n"
        "backend/services/trtllm/serving.build_llm). Keys are tensorrt_llm.LLM(...) arguments, as in\n"
        "trtllm-serve's --extra_llm_api_options. Not yet run on a GPU."))
    drafters = drafter_entries([n.strip() for n in args.drafters.split(",") if n.strip()], target,
                               args.drafter_dir.resolve(), ckpt, args.build_drafters)
    manifest = {
        "format": "specserve-trtllm/1",
        "tensorrt_llm": {"written_for": _api.WRITTEN_FOR, "installed": _api.installed_version(),
                         "backend": "pytorch", "engine_build": None},
        "checkpoint": {"path": str(served), "source": str(ckpt), "architectures": target.get("architectures"),
                       "torch_dtype": target.get("torch_dtype"), "quantization": quantization(served)},
        "llm_api_config": str(llm_config.FILE), "settings": settings,
        "drafters": drafters,
        "prepared": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "run_on_gpu": False,  # nothing on this path has run on a GPU yet (docs/trtllm.md)
    }
    (served / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    log(f"wrote {config_file} and {served / MANIFEST}")
    return served


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", type=Path, required=True, help="the Hugging Face target directory")
    ap.add_argument("--quantize", choices=sorted(QUANT_CONFIGS), help="write a ModelOpt-quantized variant and serve that")
    ap.add_argument("--out", type=Path, help="the quantized variant's directory (default: <checkpoint>-<scheme>)")
    ap.add_argument("--calib-file", type=Path, help="calibration texts, separated by blank lines")
    ap.add_argument("--calib-samples", type=int, default=512)
    ap.add_argument("--device", default="cuda", help="where ModelOpt calibrates")
    ap.add_argument("--force", action="store_true", help="quantize again even if the variant exists")
    defaults = ServerConfig.load({})  # SPECSERVE_* in the environment (as the server reads them)
    ap.add_argument("--max-batch", type=int, default=defaults.max_batch)
    ap.add_argument("--max-context", type=int, default=defaults.max_context)
    ap.add_argument("--tensor-parallel-size", type=int, default=defaults.tensor_parallel_size)
    ap.add_argument("--kv-fraction", type=float, default=llm_config.DEFAULT_FREE_GPU_MEMORY_FRACTION,
                    help="TensorRT-LLM's free_gpu_memory_fraction for the KV cache")
    ap.add_argument("--kv-budget-mb", type=int, default=0, help="cap the KV cache (0: room for max-batch contexts)")
    ap.add_argument("--no-block-reuse", action="store_true", help="turn KV block reuse across requests off")
    ap.add_argument("--drafters", default=defaults.drafters)
    ap.add_argument("--drafter-dir", type=Path, default=ROOT / defaults.drafter_dir)
    ap.add_argument("--build-drafters", choices=("quick", "full"), default="",
                    help="distill missing model drafters with this preset")
    return ap


def main(argv=None) -> int:
    prepare(parser().parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
