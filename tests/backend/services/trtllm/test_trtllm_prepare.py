"""Offline preparation for the TensorRT-LLM path (build_engines/prepare_trtllm.py) and the server
reading what it wrote (backend/services/trtllm/llm_config.py, serving.build_llm), against the fake
`tensorrt_llm`; the quantized variant against a stand-in for NVIDIA ModelOpt that records the
calls TensorRT-LLM's docs prescribe. Not a GPU run."""
import json
import logging
import sys
import types
from pathlib import Path

import pytest
import yaml

from backend.server_config import ServerConfig
from build_engines import prepare_trtllm

ROOT = Path(__file__).resolve().parents[4]
DRAFTERS = ROOT / ".cache" / "drafters"


@pytest.fixture
def target(checkpoint, tmp_path):
    """The default checkpoint, linked file by file into a directory the test may write in."""
    d = tmp_path / "smollm2"
    d.mkdir()
    for f in checkpoint.iterdir():
        if f.is_file():
            (d / f.name).symlink_to(f)
    return d


def run(*argv):
    return prepare_trtllm.prepare(prepare_trtllm.parser().parse_args(list(argv)))


def test_prepare_writes_the_settings_and_a_manifest(target, model_drafters):
    served = run("--checkpoint", str(target), "--max-batch", "16", "--max-context", "1024", "--kv-fraction", "0.5",
                 "--no-block-reuse", "--drafters", "ngram,suffix,chat", "--drafter-dir", str(DRAFTERS))
    assert served == target.resolve()
    settings = yaml.safe_load((target / "trtllm" / "llm_api.yaml").read_text())
    assert settings == {"backend": "pytorch", "disable_overlap_scheduler": True,
                        "guided_decoding_backend": "llguidance", "skip_tokenizer_init": False,
                        "max_batch_size": 16, "max_seq_len": 1024, "tensor_parallel_size": 1,
                        "enable_iter_perf_stats": True,
                        "kv_cache_config": {"free_gpu_memory_fraction": 0.5, "enable_block_reuse": False,
                                            "max_tokens": 16 * 1024}}
    m = json.loads((target / "trtllm" / "manifest.json").read_text())
    assert m["tensorrt_llm"] == {"written_for": "1.2.1", "installed": None, "backend": "pytorch", "engine_build": None}
    assert m["checkpoint"]["quantization"] is None and m["checkpoint"]["architectures"] == ["LlamaForCausalLM"]
    assert m["run_on_gpu"] is False and m["settings"] == settings
    kinds = {d["name"]: d["kind"] for d in m["drafters"]}
    assert kinds == {"ngram": "model-free", "suffix": "model-free", "chat": "model"}
    chat = next(d for d in m["drafters"] if d["name"] == "chat")
    assert chat["weight_bytes"] > 0 and Path(chat["path"]).name.startswith("chat-drafter")


@pytest.mark.parametrize("drafters, message", [("nosuch", "not in"), ("chat-feature", "hidden states")])
def test_prepare_refuses_drafters_the_path_cannot_serve(target, drafters, message, model_drafters):
    with pytest.raises(SystemExit, match=message):
        run("--checkpoint", str(target), "--drafters", drafters, "--drafter-dir", str(DRAFTERS))


def test_prepare_refuses_a_directory_that_is_no_checkpoint(tmp_path):
    with pytest.raises(SystemExit, match="config.json"):
        run("--checkpoint", str(tmp_path))


# -- the quantized variant: NVIDIA ModelOpt's PTQ + unified HF export, stood in for ---------------------
@pytest.fixture
def fake_modelopt(monkeypatch):
    calls = []
    mtq = types.ModuleType("modelopt.torch.quantization")
    mtq.FP8_DEFAULT_CFG, mtq.NVFP4_DEFAULT_CFG = {"quant": "fp8"}, {"quant": "nvfp4"}

    def quantize(model, config, forward_loop):
        calls.append(("quantize", config))
        forward_loop(model)
        return model
    mtq.quantize = quantize
    export = types.ModuleType("modelopt.torch.export")

    def export_hf_checkpoint(model, dtype=None, export_dir="/tmp", save_modelopt_state=False):
        calls.append(("export", Path(export_dir)))
        model.save_pretrained(export_dir)
        (Path(export_dir) / "hf_quant_config.json").write_text(json.dumps(
            {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": None}}))
    export.export_hf_checkpoint = export_hf_checkpoint
    for name, mod in (("modelopt", types.ModuleType("modelopt")), ("modelopt.torch", types.ModuleType("modelopt.torch")),
                      ("modelopt.torch.quantization", mtq), ("modelopt.torch.export", export)):
        monkeypatch.setitem(sys.modules, name, mod)
    return calls


def test_quantized_variant_is_a_modelopt_hf_checkpoint_served_with_its_own_settings(target, fake_modelopt, tmp_path):
    calib = tmp_path / "calib.txt"
    calib.write_text("first text to calibrate with\n\nsecond one\n\nthird")
    served = run("--checkpoint", str(target), "--quantize", "fp8", "--device", "cpu", "--calib-file", str(calib),
                 "--calib-samples", "2", "--drafters", "ngram")
    assert served == target.with_name("smollm2-fp8").resolve()
    assert [c[0] for c in fake_modelopt] == ["quantize", "export"]
    assert fake_modelopt[0][1] == {"quant": "fp8"}
    assert (served / "hf_quant_config.json").exists() and (served / "tokenizer.json").exists()
    m = json.loads((served / "trtllm" / "manifest.json").read_text())
    assert m["checkpoint"]["quantization"]["quant_algo"] == "FP8"
    assert m["checkpoint"]["source"] == str(target.resolve())
    assert (served / "trtllm" / "llm_api.yaml").exists() and not (target / "trtllm").exists()
    # an already quantized directory is served as it is
    with pytest.raises(SystemExit, match="already quantized"):
        run("--checkpoint", str(served), "--quantize", "fp8")


def test_quantizing_without_modelopt_says_where_to_run_it(target, monkeypatch):
    monkeypatch.setitem(sys.modules, "modelopt", None)
    with pytest.raises(SystemExit, match="ModelOpt"):
        run("--checkpoint", str(target), "--quantize", "fp8", "--device", "cpu")


# -- the server reads what was prepared -------------------------------------------------------------------
@pytest.fixture
def fake_llm(fake_trtllm, trt_engine, monkeypatch):
    from tensorrt_llm import _fake

    from fake_executor import FakePyExecutor
    _fake.EXECUTOR_FACTORY = lambda llm: FakePyExecutor(trt_engine, llm.drafter, 4)
    monkeypatch.setenv("TLLM_WORKER_USE_SINGLE_PROCESS", "1")


def build(cfg):
    from backend.services.trtllm.serving import build_llm
    llm, _ = build_llm(cfg, ROOT, max_draft_len=4)
    return llm.args


def test_build_llm_reads_the_prepared_settings(fake_llm, target, caplog):
    run("--checkpoint", str(target), "--max-batch", "8", "--max-context", "512", "--kv-fraction", "0.4",
        "--no-block-reuse", "--drafters", "ngram")
    args = build(ServerConfig(checkpoint=str(target), max_batch=8, max_context=512, drafters="ngram", policy="static"))
    kv = args["kv_cache_config"]
    assert (kv.free_gpu_memory_fraction, kv.enable_block_reuse, kv.max_tokens) == (0.4, False, 8 * 512)
    assert args["enable_iter_perf_stats"] is True and args["tensor_parallel_size"] == 1
    assert (args["max_batch_size"], args["max_seq_len"]) == (8, 512)
    # a server config that disagrees wins (our request limits come from it), and says so
    with caplog.at_level(logging.WARNING, logger="specserve.trtllm"):
        args = build(ServerConfig(checkpoint=str(target), max_batch=4, max_context=512, drafters="ngram",
                                  policy="static"))
    assert args["max_batch_size"] == 4 and "max_batch_size=8" in caplog.text


def test_build_llm_without_a_prepared_file_derives_the_settings(fake_llm, target):
    args = build(ServerConfig(checkpoint=str(target), max_batch=2, max_context=128, drafters="ngram", policy="static"))
    kv = args["kv_cache_config"]
    assert (kv.free_gpu_memory_fraction, kv.enable_block_reuse, kv.max_tokens) == (0.9, True, 256)
    assert args["enable_iter_perf_stats"] is True


@pytest.mark.parametrize("content, message", [
    ({"model": "/elsewhere"}, "set by the server"),
    ({"disable_overlap_scheduler": False}, "break the adapter"),
    ({"kv_cache_config": 0.5}, "mapping"),
    ({"guided_decoding_backend": "xgrammar"}, "only llguidance"),
    ({"skip_tokenizer_init": True}, "without the tokenizer"),
])
def test_a_settings_file_that_would_break_the_adapter_is_refused(fake_llm, target, tmp_path, content, message):
    f = tmp_path / "llm.yaml"
    f.write_text(yaml.safe_dump(content))
    with pytest.raises(ValueError, match=message):
        build(ServerConfig(checkpoint=str(target), trtllm_config=str(f), drafters="ngram", policy="static"))


def test_a_settings_file_may_switch_structured_output_off(fake_llm, target, tmp_path):
    f = tmp_path / "llm.yaml"
    f.write_text(yaml.safe_dump({"guided_decoding_backend": None, "skip_tokenizer_init": True}))
    args = build(ServerConfig(checkpoint=str(target), trtllm_config=str(f), drafters="ngram", policy="static"))
    assert args["guided_decoding_backend"] is None and args["skip_tokenizer_init"] is True


def test_a_named_settings_file_must_exist(fake_llm, target, tmp_path):
    with pytest.raises(FileNotFoundError, match="prepare_trtllm"):
        build(ServerConfig(checkpoint=str(target), trtllm_config=str(tmp_path / "none.yaml"), drafters="ngram"))


# -- tensor parallelism ----------------------------------------------------------------------------------------
def test_tensor_parallel_size_is_read_from_the_server_config_and_passed_on(fake_llm, target, monkeypatch):
    cfg = ServerConfig.load({"checkpoint": str(target), "engine": "trtllm", "drafters": "ngram", "policy": "static"},
                            env={"SPECSERVE_TENSOR_PARALLEL_SIZE": "2"})
    assert cfg.tensor_parallel_size == 2
    monkeypatch.delenv("TLLM_WORKER_USE_SINGLE_PROCESS")
    assert build(cfg)["tensor_parallel_size"] == 2  # worker mode: the ngram-only drafter pickles
    # ranks must draft alike: policies that read step times, and unpicklable drafters, are refused
    with pytest.raises(ValueError, match="every rank"):
        build(ServerConfig(checkpoint=str(target), engine="trtllm", tensor_parallel_size=2, drafters="ngram",
                           policy="composite"))
    with pytest.raises(ValueError, match="worker process"):
        build(ServerConfig(checkpoint=str(target), engine="trtllm", tensor_parallel_size=2, drafters="suffix",
                           policy="static"))
    with pytest.raises(ValueError, match="needs engine trtllm"):
        ServerConfig.load({"tensor_parallel_size": "2"}, env={})


def test_the_server_warns_when_another_tensorrt_llm_line_is_installed(fake_llm, target, monkeypatch, caplog):
    from backend.services.trtllm import _api
    run("--checkpoint", str(target), "--drafters", "ngram")
    cfg = ServerConfig(checkpoint=str(target), drafters="ngram", policy="static")
    for installed, warned in (("1.2.1", False), ("1.3.0rc2", True)):
        monkeypatch.setattr(_api, "installed_version", lambda: installed)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="specserve.trtllm"):
            build(cfg)
        assert ("was prepared for 1.2.1" in caplog.text) == warned
