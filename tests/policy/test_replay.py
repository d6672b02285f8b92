"""A recorded trace replays a policy's decisions exactly (policy.replay), and a replay
can tell a different policy apart."""
import json
import random

import pytest

from policy import make_policy
from policy.environments import ENVIRONMENTS
from policy.replay import main as replay_main, read_trace, reproduce
from policy.simulator import DEFAULT_PARAMS

from helpers import record_trace


def params_for(name, env):
    params = dict(DEFAULT_PARAMS.get(name, {}))
    if "drafters" in params:
        params["drafters"] = [d for d in params["drafters"] if any(e.name == d for e in env.drafters)]
    return params


def record(name, env, seed=0, steps=250):
    return record_trace(make_policy(name, rng=random.Random(seed), **params_for(name, env)), env, steps, seed)


@pytest.mark.parametrize("env_name", ["mixed", "batch"])
@pytest.mark.parametrize("name", sorted(DEFAULT_PARAMS))
def test_a_trace_replays_the_same_policy_exactly(name, env_name):
    env = ENVIRONMENTS[env_name]()
    trace = record(name, env)
    check = reproduce(make_policy(name, rng=random.Random(0), **params_for(name, env)), trace)
    assert check.steps == len(trace) and check.decisions >= len(trace)
    assert check.exact, check.mismatches


def test_a_replay_tells_another_policy_apart():
    env = ENVIRONMENTS["mixed"]()
    trace = record("composite", env)
    other = reproduce(make_policy("static", drafter="draft", gamma=3), trace)
    assert not other.exact
    # the same policy learning from a different seed explores differently
    nightjar = record("nightjar", env, seed=1)
    assert not reproduce(make_policy("nightjar", rng=random.Random(2), **params_for("nightjar", env)), nightjar).exact


def test_replay_cli(tmp_path, capsys):
    env = ENVIRONMENTS["stationary"]()
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(o.to_dict()) + "\n" for o in record("static", env, steps=40)))
    assert len(read_trace(str(path))) == 40
    cfg = tmp_path / "static.yaml"
    cfg.write_text("policy: static\nparams:\n  drafter: draft\n  gamma: 4\n")
    assert replay_main([str(path), "--config", str(cfg)]) == 0
    assert "identical" in capsys.readouterr().out
    cfg.write_text("policy: static\nparams:\n  drafter: draft\n  gamma: 2\n")
    assert replay_main([str(path), "--config", str(cfg)]) == 1
