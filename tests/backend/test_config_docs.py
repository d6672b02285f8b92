"""One source of defaults, documented: every ServerConfig key and every SPECSERVE_* variable the
code reads is in the README's tables; an unknown one is reported naming the closest; the loop's
defaults are the server's."""
import logging
import re
from dataclasses import fields
from pathlib import Path

from backend.loop.config import LoopConfig
from backend.server_config import OTHER_ENV, SERVICE_LINK_PREFIXES, ServerConfig, known_env, unknown_env

HERE = Path(__file__).resolve()  # spells misspellings on purpose
ROOT = HERE.parents[2]
README = (ROOT / "README.md").read_text()
SOURCES = ["backend", "build_engines", "policy", "scripts", "docker", "deploy", "model_repository", "bench", "tests"]


def first_cells() -> set:
    """The backticked names in the first cell of every README table row."""
    names = set()
    for line in README.splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`([^`]+)`", line.split("|")[1]))
    return names


def without_doctests(text: str) -> str:
    """The text without doctest examples and their expected output (they misspell on purpose)."""
    out, in_example = [], False
    for line in text.splitlines():
        stripped = line.strip()
        in_example = stripped.startswith(">>>") or (in_example and stripped != "" and stripped != '"""')
        if not in_example:
            out.append(line)
    return "\n".join(out)


def test_every_config_key_is_in_the_parameter_table():
    cells = first_cells()
    assert [f.name for f in fields(ServerConfig) if f.name not in cells] == []


def test_every_other_variable_is_in_the_environment_table():
    cells = first_cells()
    assert [v for v in OTHER_ENV if v not in cells] == []


def test_every_variable_the_code_reads_is_known():
    seen = set()
    for folder in SOURCES:
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and path.suffix in (".py", ".sh", ".yaml", ".yml", ".pbtxt", "") and path != HERE:
                seen.update(re.findall(r"SPECSERVE_[A-Z0-9_]*[A-Z0-9]", without_doctests(path.read_text(errors="ignore"))))
    links = tuple(p.rstrip("_") for p in SERVICE_LINK_PREFIXES)
    assert {v for v in seen if v not in known_env() and not v.startswith(links)} == set()


def test_a_misspelt_variable_is_reported_with_the_closest_name(caplog):
    assert unknown_env({"SPECSERVE_DRAFTER": "ngram", "SPECSERVE_SERVICE_HOST": "10.0.0.1"}) == [
        "SPECSERVE_DRAFTER is not a setting of this server and is ignored; did you mean SPECSERVE_DRAFTERS?"]
    with caplog.at_level(logging.WARNING, logger="specserve"):
        cfg = ServerConfig.load({}, env={"SPECSERVE_MAX_BACH": "8"})
    assert cfg.max_batch == ServerConfig.max_batch and "did you mean SPECSERVE_MAX_BATCH?" in caplog.text


def test_the_loops_defaults_are_the_servers():
    server, loop = ServerConfig(), LoopConfig()
    assert (loop.prefill_chunk, loop.reuse_prefix, loop.trace_len) == (server.prefill_chunk, server.reuse_prefix, 0)
    built = LoopConfig.from_server(ServerConfig(max_batch=4, max_queue=0, kv_budget_mb=2, tpot_slo_ms=50))
    assert built.max_batch == 4 and built.max_queue == 16 and built.kv_budget_bytes == 2 << 20
    assert built.tpot_slo_s == 0.05 and built.limits.max_new_tokens_limit == ServerConfig.max_tokens_limit
