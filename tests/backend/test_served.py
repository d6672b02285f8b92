"""The served configuration, resolved once by the launcher (backend/served.py): one policy key,
refused at launch when misspelt or named twice, and one record every model reads."""
import pytest

from backend import served
from backend.server_config import ServerConfig
from policy import PolicyConfigError


def write_repository(root, **params):
    """A model repository whose llm/config.pbtxt sets these parameters (as the real one does)."""
    (root / "llm").mkdir(parents=True)
    lines = [f'parameters: {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in params.items()]
    (root / "llm" / "config.pbtxt").write_text('name: "llm"\nbackend: "python"\n' + "\n".join(lines) + "\n")
    return root


def test_the_repository_and_the_environment(tmp_path):
    repo = write_repository(tmp_path / "repo", drafters="ngram,chat", max_batch="8")
    cfg = served.from_repository(repo, env={"SPECSERVE_MAX_BATCH": "4"})
    assert cfg.drafters == "ngram,chat" and cfg.max_batch == 4


def test_one_policy_key_takes_a_name_or_a_file():
    assert served.resolve({"policy": "static"}, env={}).policy == "static"
    cfg = served.resolve({"policy": "configs/policies/composite.yaml"}, env={"SPECSERVE_POLICY": "off"})
    assert cfg.policy == "off" and not cfg.policy_file()  # the environment over config.pbtxt, as for every key
    cfg = served.resolve({"policy": "configs/policies/composite.yaml"}, env={})
    assert cfg.policy_file()
    # the former key for a file still reads, alone; empty it is unset
    assert served.resolve({"policy_config": "configs/policies/off.yaml"}, env={}).policy == "configs/policies/off.yaml"
    assert served.resolve({"policy": "off"}, env={"SPECSERVE_POLICY_CONFIG": ""}).policy == "off"


@pytest.mark.parametrize("params,env,words", [
    # config.pbtxt names a policy file, SPECSERVE_POLICY a policy: one was silently ignored before
    ({"policy_config": "configs/policies/composite.yaml"}, {"SPECSERVE_POLICY": "off"},
     "two policies are named: SPECSERVE_POLICY 'off' and the served config's policy_config"),
    ({"policy": "configs/policies/composite.yaml"}, {"SPECSERVE_POLICY_CONFIG": "configs/policies/off.yaml"},
     "two policies are named: the served config's policy 'configs/policies/composite.yaml' and SPECSERVE_POLICY_CONFIG"),
    ({"policy": "static", "policy_config": "configs/policies/off.yaml"}, {}, "two policies are named"),
])
def test_two_policies_named_are_refused(params, env, words):
    with pytest.raises(ValueError, match=words):
        served.resolve(params, env=env)


@pytest.mark.parametrize("params,words", [
    ({"policy": "compsite"}, "unknown policy 'compsite'; did you mean 'composite'?"),
    ({"policy": "configs/policies/nosuch.yaml"}, "nosuch.yaml"),
])
def test_a_misspelt_policy_is_refused(params, words):
    with pytest.raises(PolicyConfigError, match=words):
        served.resolve(params, env={})


def test_the_launcher_refuses_a_misspelt_policy_before_starting_anything(tmp_path, monkeypatch, capsys):
    """Before, the launcher's pre-check passed a policy name unchecked and Triton started, to fail
    when it loaded the model."""
    from backend.frontend.supervisor import cli
    repo = write_repository(tmp_path / "repo", policy="compsite")

    def started(*a, **kw):
        raise AssertionError("the launcher went on to start Triton")
    for name in ("Supervisor", "stop_orphan_servers", "reap_stubs"):
        monkeypatch.setattr(cli, name, started)
    monkeypatch.setenv("SPECSERVE_BUILD_ON_DEMAND", "0")
    assert cli.main([f"--model-repository={repo}", "--http-port=1", "--grpc-port=2", "--metrics-port=3"]) == 2
    assert "cannot be served: unknown policy 'compsite'; did you mean 'composite'?" in capsys.readouterr().err


def test_models_read_the_launchers_record(tmp_path):
    cfg = served.resolve({"max_batch": "3", "policy": "off"}, env={})
    path = served.write(cfg, tmp_path / "served.json")
    assert served.read(path) == cfg
    # a model's own parameters and environment say otherwise: the record wins
    assert served.for_model({"max_batch": "9"}, env={served.SERVED_ENV: str(path), "SPECSERVE_MAX_BATCH": "5"}) == cfg
    assert served.for_model({"max_batch": "9"}, env={}).max_batch == 9  # no launcher: its own parameters


def test_one_default_length():
    """The server's default max_tokens applies in one place (the adapter and the OpenAI API ask
    ServerConfig.max_new_tokens); a GenerationRequest has no default of its own."""
    from backend.generation.request import GenerationRequest
    assert (ServerConfig(default_max_tokens=7).max_new_tokens(None), ServerConfig().max_new_tokens(3)) == (7, 3)
    with pytest.raises(TypeError, match="max_new_tokens"):
        GenerationRequest(prompt="x")
