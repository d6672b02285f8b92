"""scripts/run_step.sh: a set-up step that crashes in native code is named, with the signal, the
CPU's SIMD flags and what to try, not a bare "Segmentation fault" (issue 39: the AMX crash
left only bash's one line); a step that fails plainly passes its exit code on."""
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_step(*command: str) -> subprocess.CompletedProcess:
    script = '. scripts/run_step.sh; run_step "measuring a thing" "$@"'
    return subprocess.run(["bash", "-c", script, "bash", *command], cwd=ROOT, capture_output=True, text=True)


def test_a_segfaulting_step_is_named_with_what_to_try():
    out = run_step("python3", "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    assert out.returncode == 128 + 11
    assert "FAILED: measuring a thing crashed (SIGSEGV) in native code" in out.stderr
    assert "SIMD:" in out.stderr and "Try: a rebuild for this machine" in out.stderr
    assert "SPECSERVE_Q8_MATMUL=0" in out.stderr  # our kernels told from llama.cpp's


def test_an_illegal_instruction_points_at_the_cached_build():
    out = run_step("python3", "-c", "import os, signal; os.kill(os.getpid(), signal.SIGILL)")
    assert out.returncode == 128 + 4 and "made for another CPU" in out.stderr


def test_a_plain_failure_keeps_its_exit_code_and_a_success_is_silent():
    failed = run_step("python3", "-c", "raise SystemExit(3)")
    assert failed.returncode == 3 and "FAILED: measuring a thing (exit code 3)" in failed.stderr
    ok = run_step("true")
    assert ok.returncode == 0 and ok.stderr == ""
