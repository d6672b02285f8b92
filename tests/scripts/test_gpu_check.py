"""scripts/gpu_check.sh without a GPU or a Docker daemon: stand-ins for `docker` and `nvidia-smi`
on the PATH log every call, so the tests check what the script would run, in which order (build,
tests, per arm and streams a server started with that arm's settings, its health awaited, the
benchmark run in it, the server stopped; the table last), and that it stops with a clear message
when a prerequisite is missing. Where a real docker CLI is installed, every logged command line is
also parsed by it (no daemon needed: a bad flag fails before it connects)."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
sys.path.insert(0, str(ROOT / "bench"))  # bench/ scripts import their siblings

from bench_gpu_policies import ARMS, arm_env  # noqa: E402

SYSTEM_PATH = "/usr/bin:/bin"
GPU = "NVIDIA H100 80GB HBM3"

FAKE_DOCKER = """#!{python}
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps(["docker"] + args) + "\\n")
cmd = args[0] if args else ""
if cmd == "run" and "nvidia-smi" in args:
    print("GPU 0: {gpu} (UUID: GPU-fake)")
elif cmd == "run" and "pytest" in args:
    print("2 passed")
    sys.exit(int(os.environ.get("FAKE_TESTS_RC", "0")))
elif cmd == "run" and "-d" in args:
    print("f00dcafe")
elif cmd == "build":
    print("#1 building")
    sys.exit(int(os.environ.get("FAKE_BUILD_RC", "0")))
elif cmd == "image" and os.environ.get("FAKE_NO_IMAGE"):
    sys.exit(1)
elif cmd == "inspect":
    print("true")
elif cmd == "exec" and "measure" in args:
    print("  fake measurement")
    sys.exit(int(os.environ.get("FAKE_MEASURE_RC", "0")))
elif cmd == "run" and "report" in args:
    print("| streams | plain (tok/s) | ngram γ=4 | composite |")
"""

FAKE_NVIDIA_SMI = """#!{python}
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps(["nvidia-smi"] + args) + "\\n")
if "-L" in args:
    print("GPU 0: {gpu} (UUID: GPU-fake)")
elif "--query-gpu=name" in args:
    print("{gpu}")
elif "--query-gpu=driver_version" in args:
    print(os.environ.get("FAKE_DRIVER", "590.44.01"))
else:
    print("| NVIDIA-SMI 590.44.01 |")
"""


@pytest.fixture
def fake(tmp_path):
    """A bin/ folder with the stand-ins, a model cache with one checkpoint, and a runner."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("docker", FAKE_DOCKER), ("nvidia-smi", FAKE_NVIDIA_SMI)):
        (bin_dir / name).write_text(text.format(python=sys.executable, gpu=GPU))
        (bin_dir / name).chmod(0o755)
    cache = tmp_path / "cache"
    (cache / "models" / "tiny").mkdir(parents=True)
    (cache / "models" / "tiny" / "config.json").write_text("{}")
    log = tmp_path / "calls.jsonl"

    def run(*args, path=None, **env):
        log.unlink(missing_ok=True)
        full_env = {"PATH": path or f"{bin_dir}:{SYSTEM_PATH}", "HOME": str(tmp_path), "FAKE_LOG": str(log), **env}
        proc = subprocess.run(["bash", str(SCRIPT), "--cache", str(cache), "--model", "tiny",
                               "--results", str(tmp_path / "run"), *args],
                              env=full_env, capture_output=True, text=True, timeout=60)
        calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        return proc, calls

    run.bin, run.cache, run.results = bin_dir, cache, tmp_path / "run"
    return run


def docker_calls(calls):
    return [c[1:] for c in calls if c[0] == "docker"]


def step(call):
    """A docker call in a word or two, for the sequence."""
    if call[:2] == ["buildx", "version"]:
        return "buildx"
    if call[0] == "run":
        for word, name in (("-L", "probe"), ("pytest", "tests"), ("prompts", "prompts"), ("report", "report"),
                           ("-d", "serve")):
            if word in call:
                return name
    if call[0] == "exec":
        return "ready?" if "check" in call else "measure" if "measure" in call else "exec"
    return call[0]


def env_of(call):
    """The -e KEY=VALUE settings of a docker run."""
    return dict(call[i + 1].split("=", 1) for i, word in enumerate(call) if word == "-e")


def value_after(call, flag):
    return call[call.index(flag) + 1]


def test_the_script_parses():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    assert os.access(SCRIPT, os.X_OK)


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_shellcheck_finds_nothing():
    subprocess.run(["shellcheck", str(SCRIPT)], check=True)


def test_builds_tests_then_serves_and_measures_each_arm_at_each_level(fake):
    proc, calls = fake("--streams", "1 8", "--seconds", "5")
    assert proc.returncode == 0, proc.stderr
    docker = docker_calls(calls)
    per_level = ["serve", "ready?", "measure", "logs", "stop", "rm"]
    assert [step(c) for c in docker] == (["info", "buildx", "probe", "build", "tests", "prompts"]
                                         + per_level * (len(ARMS) * 2) + ["report", "rm"])
    build = next(c for c in docker if c[0] == "build")
    assert build == ["build", "-f", str(ROOT / "docker" / "Dockerfile.trtllm"), "-t", "specserve-trtllm", str(ROOT)]
    tests = next(c for c in docker if step(c) == "tests")
    assert tests[tests.index("specserve-trtllm") + 1:] == ["python3", "-m", "pytest", "-p", "no:cacheprovider", "-m",
                                                           "gpu or cuda", "tests/backend/services/trtllm"]
    assert value_after(tests, "--gpus") == "all" and f"{fake.cache}:/cache:ro" in tests
    assert env_of(tests) == {"SPECSERVE_TRTLLM_MODEL": "/cache/models/tiny"}

    serves = [c for c in docker if step(c) == "serve"]
    measures = [c for c in docker if step(c) == "measure"]
    levels = [(arm, n) for arm in ARMS for n in (1, 8)]  # arms outer, levels inner, as bench_speculation's Part B
    assert [(value_after(m, "--arm"), int(value_after(m, "--streams"))) for m in measures] == levels
    for (arm, n), serve, measure in zip(levels, serves, measures):
        assert env_of(serve) == {"SPECSERVE_CHECKPOINT": "/cache/models/tiny", "SPECSERVE_MAX_BATCH": "32",
                                 **arm_env(arm)}  # the settings the benchmark says serve that arm
        assert serve[-1] == "specserve-trtllm"  # the image's own command: the launcher (entrypoint.py serve)
        assert value_after(serve, "--gpus") == "all" and "--shm-size=2g" in serve
        assert f"{fake.cache}:/cache:ro" in serve and f"{fake.results}:/results" in serve
        name = value_after(serve, "--name")
        assert measure[measure.index(name) + 1:measure.index("--arm")] == ["python3", "bench/bench_gpu_policies.py",
                                                                          "measure"]
        assert (value_after(measure, "--seconds"), value_after(measure, "--max-tokens")) == ("5", "64")
        assert value_after(measure, "--device") == GPU and value_after(measure, "--out") == "/results/gpu_policies.json"
    assert len({value_after(s, "--name") for s in serves}) == 1
    report = docker[-2]
    assert report[report.index("bench/bench_gpu_policies.py") + 1:] == ["report", "--out", "/results/gpu_policies.json"]
    assert "| streams | plain (tok/s)" in proc.stdout and "tests: passed" in proc.stdout
    assert (fake.results / "table.txt").exists() and (fake.results / "nvidia-smi.txt").exists()
    assert "(6 server starts, about" in proc.stdout


def test_more_than_32_streams_get_that_many_batch_slots_and_the_skips_skip(fake):
    proc, calls = fake("--streams", "64", "--arms", "plain", "--skip-build", "--skip-tests")
    assert proc.returncode == 0, proc.stderr
    docker = docker_calls(calls)
    assert [step(c) for c in docker] == ["info", "buildx", "probe", "image", "prompts", "serve", "ready?", "measure",
                                         "logs", "stop", "rm", "report", "rm"]
    assert env_of(docker[5])["SPECSERVE_MAX_BATCH"] == "64"
    proc, calls = fake("--skip-build", "--skip-tests", "--skip-bench")
    assert proc.returncode == 0 and [step(c) for c in docker_calls(calls)] == ["info", "buildx", "probe", "image", "rm"]


def test_options_come_from_the_environment_too(fake):
    proc, calls = fake(GPU_CHECK_STREAMS="2", GPU_CHECK_ARMS="static", GPU_CHECK_GPUS="device=1",
                       GPU_CHECK_IMAGE="mine", GPU_CHECK_BASE_IMAGE="nvcr.io/nvidia/tritonserver:26.06-trtllm-python-py3",
                       GPU_CHECK_SKIP_TESTS="1")
    assert proc.returncode == 0, proc.stderr
    docker = docker_calls(calls)
    build = next(c for c in docker if c[0] == "build")
    assert value_after(build, "-t") == "mine"
    assert value_after(build, "--build-arg") == "TRITON_TRTLLM_IMAGE=nvcr.io/nvidia/tritonserver:26.06-trtllm-python-py3"
    serve, = [c for c in docker if step(c) == "serve"]
    assert value_after(serve, "--gpus") == "device=1" and serve[-1] == "mine" and env_of(serve)["SPECSERVE_POLICY"] == "configs/policies/static.yaml"


def test_failing_tests_do_not_stop_the_benchmark_but_fail_the_run(fake):
    proc, calls = fake("--streams", "1", "--arms", "plain", FAKE_TESTS_RC="1")
    assert proc.returncode == 1
    assert "measure" in [step(c) for c in docker_calls(calls)]
    assert "tests: FAILED" in proc.stdout


def test_a_failed_measurement_stops_with_the_server_log_and_removes_the_container(fake):
    proc, calls = fake("--streams", "1", "--skip-tests", FAKE_MEASURE_RC="1")
    assert proc.returncode == 4
    assert "plain, 1 streams: the benchmark failed" in proc.stderr and "server-plain-1.log" in proc.stderr
    docker = docker_calls(calls)
    assert [step(c) for c in docker][-2:] == ["logs", "rm"] and docker[-1][:2] == ["rm", "-f"]


@pytest.mark.parametrize("missing, kept, says", [
    ("nvidia-smi", "docker", ("nvidia-smi not found", "NVIDIA driver")),
    ("docker", "nvidia-smi", ("docker not found",)),
])
def test_a_missing_tool_stops_it_before_docker_builds_or_runs_anything(fake, tmp_path, missing, kept, says):
    if shutil.which(missing, path=SYSTEM_PATH):
        pytest.skip(f"this machine has a real {missing} on the system PATH")
    only = tmp_path / f"only_{kept}"
    only.mkdir()
    (only / kept).symlink_to(fake.bin / kept)
    proc, calls = fake(path=f"{only}:{SYSTEM_PATH}")
    assert proc.returncode == 2
    assert all(text in proc.stderr for text in says)
    assert docker_calls(calls) == []


def test_a_missing_model_stops_it_with_what_to_do(fake):
    proc, calls = fake("--model", "absent")
    assert proc.returncode == 2
    assert "no checkpoint at" in proc.stderr and "scripts/setup.sh" in proc.stderr and "--model" in proc.stderr
    assert not [c for c in docker_calls(calls) if c[0] in ("build", "run")]


def test_a_failed_build_stops_it_with_the_log(fake):
    proc, calls = fake(FAKE_BUILD_RC="1")
    assert proc.returncode == 5 and "the image did not build" in proc.stderr
    assert [step(c) for c in docker_calls(calls)][-1] == "build"
    assert "#1 building" in (fake.results / "build.log").read_text()


def test_skip_build_needs_the_image(fake):
    proc, calls = fake("--skip-build", FAKE_NO_IMAGE="1")
    assert proc.returncode == 2 and "no image specserve-trtllm" in proc.stderr


def test_an_old_driver_is_warned_about(fake):
    proc, _ = fake("--skip-build", "--skip-tests", "--skip-bench", FAKE_DRIVER="550.54.15")
    assert proc.returncode == 0 and "older than the 590" in proc.stdout


@pytest.mark.parametrize("args, message", [(["--streams", "1 x"], "not a positive whole number"),
                                           (["--arms", "plain fast"], "unknown arm 'fast'"),
                                           (["--frobnicate"], "unknown option: --frobnicate")])
def test_bad_options_are_refused(fake, args, message):
    proc, calls = fake(*args)
    assert proc.returncode == 64 and message in proc.stderr and calls == []


def test_every_docker_command_line_parses_with_the_real_docker_cli(fake, tmp_path):
    """The real CLI rejects an unknown flag or a malformed value before it connects to a daemon
    (there is none here: each call ends at 'Cannot connect to the Docker daemon')."""
    real = shutil.which("docker", path=os.environ.get("PATH", "").replace(str(fake.bin), ""))
    if real is None:
        pytest.skip("no docker CLI installed")
    proc, calls = fake("--streams", "1", "--arms", "static")
    assert proc.returncode == 0, proc.stderr
    env = {"PATH": SYSTEM_PATH, "HOME": str(tmp_path), "DOCKER_HOST": f"unix://{tmp_path}/no-daemon.sock",
           "DOCKER_CONFIG": str(tmp_path / "docker-config")}
    checked = 0
    for call in docker_calls(calls):
        if call[0] in ("buildx", "build"):  # buildx is a plugin (may be absent); build's flags are the classic ones
            continue
        out = subprocess.run([real, *call], env=env, capture_output=True, text=True, timeout=30)
        text = out.stdout + out.stderr
        assert "Cannot connect to the Docker daemon" in text or call[0] == "info", (call, text)
        assert "unknown" not in text.lower() and "invalid" not in text.lower(), (call, text)
        checked += 1
    assert checked >= 10
