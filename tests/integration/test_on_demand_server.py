"""Serving something set-up did not build: the launcher builds it first, with progress, then
serves it. Here a model drafter and the policy's profile, both into empty directories."""
import json

from server_helpers import running_server


def test_a_served_config_naming_what_is_not_built_builds_it_then_serves(tmp_path, built_drafter):
    built_drafter("chat")  # its labels are cached then: the server's build below only trains
    policy = tmp_path / "composite.yaml"
    policy.write_text("policy: composite\nparams:\n  drafters: [ngram, suffix, chat]\n"
                      f"  profile_path: {tmp_path}/profiles/smollm2-135m-{{engine}}.json\n"
                      f"  switch_cost_path: {tmp_path}/profiles/smollm2-135m-{{engine}}.switch.json\n")
    env = {"SPECSERVE_MAX_BATCH": "4", "SPECSERVE_MAX_CONTEXT": "512", "SPECSERVE_DRAFTERS": "ngram,suffix,chat",
           "SPECSERVE_DRAFTER_DIR": str(tmp_path / "drafters"), "SPECSERVE_POLICY": str(policy),
           "SPECSERVE_DRAFTER_PRESET": "quick", "SPECSERVE_PROFILE_BUDGET_S": "10"}
    with running_server(env, tmp_path, ready_timeout_s=900) as srv:
        status, body = srv.generate({"text_input": "Name three colours.", "max_tokens": 16,
                                     "apply_chat_template": True, "exclude_input_in_output": True})
        assert status == 200 and body["text_output"], body
    log = (tmp_path / "server.log").read_text()
    assert "building the model drafter 'chat'" in log and "measuring the llama.cpp engine's step-time profile" in log
    assert (tmp_path / "drafters" / "chat-drafter-quick" / "config.json").exists()
    profiles = sorted(p.name for p in (tmp_path / "profiles").glob("*.json"))
    assert profiles == ["smollm2-135m-llama.cpp-Q8_0.json", "smollm2-135m-llama.cpp-Q8_0.switch.json"]
    measured = json.loads((tmp_path / "profiles" / profiles[0]).read_text())
    assert measured["drafter"].startswith("chat-drafter-quick@")  # the drafters first: the profile times them
