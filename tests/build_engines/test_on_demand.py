"""What set-up no longer builds up front is built the first time it is needed: a served config's
model drafters and profiles (before Triton starts), with a clear error naming the command when
building on demand is switched off."""
import json
import subprocess
import threading
import time

import pytest

from backend.server_config import ServerConfig
from build_engines import on_demand


def write_repository(root, **params):
    """A model repository whose llm/config.pbtxt sets these parameters (as the real one does)."""
    (root / "llm").mkdir(parents=True)
    lines = [f'parameters: {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in params.items()]
    (root / "llm" / "config.pbtxt").write_text('name: "llm"\nbackend: "python"\n' + "\n".join(lines) + "\n")
    return root


@pytest.fixture
def fake_build(monkeypatch):
    """distill_drafter.build stood in for: records the call, writes a loadable-looking artifact."""
    calls = []

    def build(domain, preset, seed, target, out_root, force=False, kind="token"):
        calls.append((domain, kind, preset))
        time.sleep(0.3)  # long enough for a second builder to arrive meanwhile
        from build_engines.distill_drafter import artifact_name
        out = out_root / artifact_name(domain, kind, preset)
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        return out

    monkeypatch.setattr("build_engines.distill_drafter.build", build)
    return calls


def test_model_drafter_names():
    assert on_demand.model_drafter("code") == ("code", "token")
    assert on_demand.model_drafter("chat-feature") == ("chat", "feature")
    assert on_demand.model_drafter("suffix") is None and on_demand.model_drafter("chat-x") is None


def test_the_served_model_drafters_are_built_before_serving(tmp_path, fake_build, monkeypatch):
    """The launcher's pre-flight: drafters the config names and nobody built are built, with the
    preset SPECSERVE_DRAFTER_PRESET names; registered drafters and built ones are left alone."""
    from backend.frontend.supervisor import build_served
    from backend.served import from_repository

    def build_what_is_served(repo):
        build_served.build_what_is_served(from_repository(repo))

    def build_process(cmd, **kw):  # run in this one (so the fake build stands in): the same command line
        assert cmd[1:4] == ["-m", "build_engines.on_demand", "served"]
        return subprocess.CompletedProcess(cmd, on_demand.main(cmd[3:]))
    monkeypatch.setattr(build_served.subprocess, "run", build_process)
    # it builds from the record the supervisor resolved: never the served config resolved a second time
    monkeypatch.setattr(on_demand, "from_repository", lambda *a, **kw: pytest.fail("resolved the config again"))
    drafters = tmp_path / "drafters"
    (drafters / "code-drafter").mkdir(parents=True)
    (drafters / "code-drafter" / "config.json").write_text("{}")  # built already (full preset)
    repo = write_repository(tmp_path / "repo", drafters="ngram,suffix,chat,code,chat-feature",
                            drafter_dir=str(drafters), policy="static")
    monkeypatch.setenv("SPECSERVE_DRAFTER_PRESET", "quick")
    build_what_is_served(repo)
    assert fake_build == [("chat", "token", "quick"), ("chat", "feature", "quick")]
    build_what_is_served(repo)  # built: nothing more to do
    assert len(fake_build) == 2
    monkeypatch.setenv("SPECSERVE_DRAFTERS", "ngram,code-feature")
    monkeypatch.setenv("SPECSERVE_BUILD_ON_DEMAND", "0")
    build_what_is_served(repo)
    assert len(fake_build) == 2  # switched off


def test_a_drafter_not_built_is_refused_with_the_command_that_builds_it(tmp_path, checkpoint):
    from backend.services.build import build_drafter
    cfg = ServerConfig(drafters="ngram,chat", drafter_dir=str(tmp_path))
    with pytest.raises(ValueError, match="python -m build_engines.on_demand drafters chat"):
        build_drafter("chat", cfg, tmp_path, engine=None)
    with pytest.raises(ValueError, match="not one of grammar, ngram, suffix"):
        build_drafter("nosuch", cfg, tmp_path, engine=None)


def test_builders_that_need_one_drafter_at_once_build_it_once(tmp_path, fake_build):
    """Each holds its own lock file description, as separate processes do."""
    results = []

    def worker():
        results.append(on_demand.ensure_drafter("chat", tmp_path, tmp_path, preset="quick"))

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(fake_build) == 1 and len(set(results)) == 1


def test_a_missing_profile_of_the_served_engine_is_measured(tmp_path, checkpoint, monkeypatch):
    """A policy config naming a profile of an engine set-up did not measure (the torch engine,
    say): measured before serving, within the budget, where the policy will read it."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(f"policy: adaspec\nparams:\n  profile_path: {tmp_path}/profiles/m-{{engine}}.json\n")
    cfg = ServerConfig(checkpoint=str(checkpoint), engine="torch", dtype="fp32", policy=str(policy),
                       drafters="ngram", drafter_dir=str(tmp_path / "drafters"))
    drafters, profiles = on_demand.served_needs(cfg, tmp_path)
    assert drafters == [] and profiles == [("torch", tmp_path / "profiles" / "m-torch-fp32.json")]
    monkeypatch.setenv("SPECSERVE_PROFILE_BUDGET_S", "4")
    t0 = time.monotonic()
    on_demand.ensure_served(cfg, tmp_path)
    prof = json.loads((tmp_path / "profiles" / "m-torch-fp32.json").read_text())
    assert prof["engine"] == "torch/fp32" and prof["budget_s"] == 4.0 and all(r[0] for r in prof["measured"])
    assert time.monotonic() - t0 < 4.0 + 60  # the budget, the first points, loading the engine
    assert on_demand.served_needs(cfg, tmp_path) == ([], [])


def test_the_domains_are_distill_drafters():
    from backend.drafters import artifacts
    from build_engines.drafter_data import DOMAINS
    assert set(artifacts.DOMAINS) == set(DOMAINS)


def test_a_load_tool_written_for_another_checkout_is_installed_again(tmp_path, monkeypatch):
    """The wrappers hold absolute paths: one written through another checkout's path to a shared
    .cache (or before the checkout moved) cannot run, so load_tool must not take it as installed."""
    bin_dir = tmp_path / "cache" / "loadtools" / "bin"
    bin_dir.mkdir(parents=True)
    monkeypatch.setattr(on_demand, "LOADTOOLS", bin_dir)
    tool = bin_dir / "perf_analyzer"
    tool.write_text('#!/usr/bin/env bash\nexec "/elsewhere/.cache/loadtools/perf-analyzer/bin/perf_analyzer" "$@"\n')
    assert not on_demand._installed_here(tool)
    tool.write_text(f'#!/usr/bin/env bash\nexec "{bin_dir.parent.resolve()}/perf-analyzer/bin/perf_analyzer" "$@"\n')
    assert on_demand._installed_here(tool)
