import random

import pytest

from policy import POLICIES, make_policy
from policy.config import PolicyConfigError, load_policy_config, policy_from_config

CONFIG_DIR = __import__("os").path.join(__import__("os").path.dirname(__file__), "..", "..", "configs", "policies")


def _write(tmp_path, text):
    p = tmp_path / "p.yaml"
    p.write_text(text)
    return str(p)


def test_valid_yaml_roundtrip(tmp_path):
    name, params = load_policy_config(_write(tmp_path, "policy: nightjar\nparams:\n  gamma_max: 6\n"))
    assert (name, params) == ("nightjar", {"gamma_max": 6})
    pol = policy_from_config({"policy": "nightjar", "params": {"gamma_max": 6}}, rng=random.Random(0))
    assert pol.cfg.gamma_max == 6


@pytest.mark.parametrize("text, fragment", [
    ("policy: nightjr\n", "unknown policy 'nightjr'"),
    ("policy: nightjar\nparams:\n  gama_max: 3\n", "unknown parameter(s) gama_max"),
    ("policy: nightjar\nparams:\n  gamma_max: 0\n", "gamma_max=0 out of range [1, 64]"),
    ("policy: nightjar\nparams:\n  gamma_max: four\n", "gamma_max must be an integer"),
    ("policy: metasd\nparams:\n  algorithm: ucb2\n", "algorithm must be one of"),
    ("policy: dsde\nparams:\n  long_window: 5\n", "long_window must exceed short_window"),
    ("policy: composite\nparams:\n  drafters: draft\n", "drafters must be a list"),
    ("polcy: static\n", "unknown top-level key(s) polcy"),
    ("params: {}\n", "needs 'policy: <name>'"),
    ("policy: [static\n", "not valid YAML"),
    ("- static\n", "must be a mapping"),
])
def test_bad_configs_give_one_clear_line(tmp_path, text, fragment):
    with pytest.raises(PolicyConfigError) as e:
        load_policy_config(_write(tmp_path, text))
    msg = str(e.value)
    assert fragment in msg and "\n" not in msg


def test_missing_file_and_bad_profile(tmp_path):
    with pytest.raises(PolicyConfigError, match="cannot read policy config"):
        load_policy_config(str(tmp_path / "nope.yaml"))
    with pytest.raises(PolicyConfigError, match="cannot read profile"):
        make_policy("adaspec", profile_path=str(tmp_path / "nope.json"))


def test_make_policy_validates_keywords_too():
    with pytest.raises(PolicyConfigError, match="unknown policy"):
        make_policy("nope")
    with pytest.raises(PolicyConfigError, match="gamma=-1 out of range"):
        make_policy("static", gamma=-1)
    assert isinstance(PolicyConfigError("x"), ValueError)


def test_every_example_config_loads_and_covers_every_policy():
    import glob
    import os
    from pathlib import Path

    from backend.served_policy import engine_name
    from backend.server_config import ServerConfig
    served = engine_name(ServerConfig(), Path(CONFIG_DIR).parents[1]).replace("/", "-")
    names = set()
    for path in sorted(glob.glob(os.path.join(CONFIG_DIR, "*.yaml"))):
        name, params = load_policy_config(path)
        # profile paths name the served engine: the set-up measures the default one's
        params = {k: v.replace("{engine}", served) if k.endswith("_path") and isinstance(v, str) else v
                  for k, v in params.items()}
        make_policy(name, rng=random.Random(0), **params)
        names.add(name)
    assert names == set(POLICIES)
