"""A short soak (issue 20): 16 gRPC streams for 60 s on the default engine and policy. Nothing
fails, every KV block is back at the end (free, or holding finished requests' cells for reuse), and the model stub's RSS does not grow after
warm-up. The 10-minute, 64-stream version is `bench/soak.py` (run by hand)."""
import importlib.util
import signal
import tempfile
from pathlib import Path

from backend.frontend.supervisor.launch import start_server

ROOT = Path(__file__).resolve().parents[2]
STREAMS, DURATION_S, RSS_GROWTH_MIB = 16, 60, 48


def load_soak():
    spec = importlib.util.spec_from_file_location("specserve_bench_soak", ROOT / "bench" / "soak.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_soak_16_streams_60s(checkpoint):
    soak = load_soak()
    log_path = Path(tempfile.mkdtemp(prefix="specserve-soak-")) / "server.log"
    with open(log_path, "w") as log:
        proc, ports = start_server(env=dict(soak.SERVER_ENV, SPECSERVE_MAX_BATCH=str(STREAMS)), log_file=log)
    try:
        result = soak.soak(f"127.0.0.1:{ports.grpc}", f"127.0.0.1:{ports.metrics}", STREAMS, DURATION_S,
                           sample_every=5.0)
        print({k: v for k, v in result.items() if k != "samples"})
        soak.plot(result, log_path.with_name("soak.png"))  # the plotting path works
        assert result["requests"] >= STREAMS and result["tokens"] > 0
        assert result["failures"] == 0, result["errors"]
        assert result["kv_blocks_total"] and result["kv_blocks_free"] == result["kv_blocks_total"], result
        assert result["rss_growth_after_warmup_mib"] is not None
        assert result["rss_growth_after_warmup_mib"] < RSS_GROWTH_MIB, result["samples"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
