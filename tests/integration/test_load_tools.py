"""NVIDIA's real load-testing clients work against the server unchanged."""
import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_perf_analyzer_streams_against_the_server(server, load_tool):
    out = subprocess.run(
        [str(load_tool("perf_analyzer")), "-m", "llm", "-u", server.grpc, "-i", "grpc", "--streaming",
         "--input-data", str(ROOT / "bench" / "perf_analyzer_input.json"), "--concurrency-range", "2",
         "--request-count", "6"],
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "Throughput:" in out.stdout and "Response Throughput" in out.stdout


def test_genai_perf_profiles_the_server(server, tmp_path, checkpoint, load_tool):
    out = subprocess.run(
        [str(load_tool("genai-perf")), "profile", "-m", "llm", "--endpoint-type", "kserve", "--backend", "tensorrtllm",
         "-u", server.grpc, "--streaming", "--tokenizer", str(checkpoint), "--concurrency", "2",
         "--request-count", "4", "--synthetic-input-tokens-mean", "32", "--output-tokens-mean", "16",
         "--output-tokens-mean-deterministic",  # min_length = 16: a fixed output length, as the README runs it
         "--artifact-dir", str(tmp_path / "artifacts")],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=dict(os.environ, COLUMNS="200"))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "Output Token Throughput" in out.stdout
    assert list((tmp_path / "artifacts").rglob("profile_export_genai_perf.json"))


def test_perf_analyzer_input_generates_its_output_length(server):
    """Each request of bench/perf_analyzer_input.json, sent as /generate, generates exactly its
    max_tokens (a chat turn with min_length = max_tokens): perf_analyzer's figures then measure
    generation, not prompt processing alone (its raw prompts once ended at once, 0 tokens)."""
    data = json.loads((ROOT / "bench" / "perf_analyzer_input.json").read_text())["data"]
    for entry in data:
        body = {name: value["content"][0] for name, value in entry.items()}
        events = server.generate(body, stream=bool(body.get("stream")))[1]
        last = events[-1] if isinstance(events, list) else events
        assert last["num_output_tokens"] == body["max_tokens"] > 0, last
