"""The served engine chooses its cost profile: `{engine}` in a policy config's profile paths
becomes the engine's name, and a profile not measured yet leaves the policy on its default
curve with a warning instead of failing the server."""
import json
import logging

import pytest

from backend.server_config import ServerConfig
from backend.served_policy import engine_name, load_policy
from policy.profiles import StepTimeProfile


@pytest.fixture
def project(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "manifest.json").write_text(json.dumps({"name": "m", "gguf": {"file": "model-Q4_0.gguf", "type": "Q4_0"}}))
    (tmp_path / "p.yaml").write_text("policy: adaspec\nparams:\n  profile_path: profiles/m-{engine}.json\n")
    return tmp_path


def cfg(**kw):
    return ServerConfig(checkpoint="ckpt", policy="p.yaml", **kw)


def test_engine_names_without_building_the_engine(project):
    assert engine_name(cfg(), project) == "llama.cpp/Q4_0"  # the default engine, the manifest's GGUF
    assert engine_name(cfg(gguf="/models/SmolLM2-135M-Instruct.Q8_0.gguf"), project) == "llama.cpp/Q8_0"
    assert engine_name(cfg(engine="torch", dtype="fp32"), project) == "torch/fp32"
    assert engine_name(cfg(engine="torch"), project) == "torch/bf16"
    assert engine_name(cfg(engine="torch", batch_invariant=False), project) == "torch/bf16-variant"


def test_each_engine_plans_with_its_own_profile(project):
    profiles = project / "profiles"
    profiles.mkdir()
    for name, t in (("llama.cpp-Q4_0", 0.020), ("torch-bf16", 0.040)):
        (profiles / f"m-{name}.json").write_text(json.dumps({
            "ctx_buckets": [128], "token_batch": [1, 2], "target_s": [[t, 2 * t]], "draft_s": [[0.0, 0.0]]}))
    llama = load_policy(cfg(), project)
    torch_ = load_policy(cfg(engine="torch"), project)
    assert llama.profile.target_s[0][0] == pytest.approx(0.020)
    assert torch_.profile.target_s[0][0] == pytest.approx(0.040)


def test_a_missing_profile_falls_back_to_the_default_curve(project, caplog):
    with caplog.at_level(logging.WARNING, logger="specserve"):
        policy = load_policy(cfg(engine="torch", dtype="fp32"), project)
    assert policy.profile == StepTimeProfile.default()
    assert "m-torch-fp32.json" in caplog.text and "profile_costs --engine torch" in caplog.text
