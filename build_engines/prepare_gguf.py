"""Prepare the GGUF the llama.cpp engine serves, next to the converted checkpoint.

The default model ships as a Q4_1 GGUF (convert_target.fetch_gguf). The served type is
chosen by measurement (docs/results.md, "llama.cpp quantization type"): Q4_1 as shipped,
or Q4_0 / Q8_0 requantized from it with llama.cpp's own `llama_model_quantize`. The file
goes into the checkpoint directory as `model-<TYPE>.gguf` and its name, type and digest
into the checkpoint's manifest.json (`gguf`), which the server reads to find it.

    python -m build_engines.prepare_gguf --checkpoint .cache/models/smollm2-135m-instruct \
        --source .cache/downloads/SmolLM2-135M-Instruct.Q4_1.gguf --type Q4_0
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import time
from pathlib import Path

DEFAULT_TYPE = "Q8_0"  # measured (bench/bench_gguf_types.py): docs/results.md "llama.cpp: which GGUF type"
FTYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7}  # llama_ftype values (LLAMA_FTYPE_MOSTLY_*)


def log(msg: str) -> None:
    print(f"[prepare_gguf] {msg}", flush=True)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def quantize(source: Path, out: Path, qtype: str, threads: int = 0) -> None:
    """Requantize with llama.cpp (allow_requantize: the source is already quantized)."""
    import llama_cpp as ll

    from backend.engines.llama_cpp import _backend_init
    _backend_init()  # llama.cpp's per-tensor log goes to Python logging (debug), not the terminal
    params = ll.llama_model_quantize_default_params()
    params.ftype = FTYPES[qtype]
    params.allow_requantize = True
    params.nthread = threads
    rc = ll.llama_model_quantize(str(source).encode(), str(out).encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize {source.name} -> {qtype} failed (code {rc})")


def source_type(source: Path) -> str:
    """The shipped file's type from its name (SmolLM2-135M-Instruct.Q4_1.gguf -> Q4_1)."""
    return source.stem.rsplit(".", 1)[-1].upper()


def prepare(checkpoint: Path, source: Path, qtype: str, force: bool = False) -> dict:
    if qtype not in FTYPES:
        raise SystemExit(f"--type must be one of {', '.join(FTYPES)}, got {qtype}")
    manifest_path = checkpoint / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    out = checkpoint / f"model-{qtype}.gguf"
    entry = manifest.get("gguf") or {}
    if not force and entry.get("type") == qtype and out.exists():
        log(f"{out} present ({qtype})")
        return entry
    t0 = time.time()
    tmp = out.with_suffix(".part")
    if source_type(source) == qtype:
        log(f"copying {source.name} ({qtype} as shipped)")
        shutil.copyfile(source, tmp)
    else:
        log(f"requantizing {source.name} to {qtype} with llama.cpp (a few seconds)")
        quantize(source, tmp, qtype)
    tmp.rename(out)
    entry = {"file": out.name, "type": qtype, "source": source.name, "sha256": sha256(out)}
    manifest["gguf"] = entry
    manifest_path.write_text(json.dumps(manifest, indent=2))
    log(f"wrote {out} ({out.stat().st_size / 2**20:.0f} MiB) in {time.time() - t0:.1f} s")
    return entry


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", type=Path, required=True, help="converted checkpoint directory (manifest.json)")
    ap.add_argument("--source", type=Path, default=None,
                    help="shipped GGUF (default: <checkpoint>/../../downloads/SmolLM2-135M-Instruct.Q4_1.gguf)")
    ap.add_argument("--type", default=DEFAULT_TYPE, choices=sorted(FTYPES))
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args(argv)
    source = args.source or args.checkpoint.parent.parent / "downloads" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    prepare(args.checkpoint, source, args.type, args.force)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
