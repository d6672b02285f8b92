"""The structured-output benchmark's pure parts (bench/bench_structured.py), without servers: its
prompts and schemas compile and the answers it counts as valid are the schema's."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))  # bench/ scripts import their siblings

from bench_structured import SCHEMAS, response_format, valid, workload  # noqa: E402
from backend.generation.guided import Guide, guide_problem  # noqa: E402


def test_every_schema_compiles_and_every_prompt_names_its_schema():
    for schema in SCHEMAS.values():
        assert guide_problem(Guide("json_schema", json.dumps(schema))) is None
    specs = workload(30)
    assert len({key for key, _ in specs}) == 30 and len({turns[0] for _, turns in specs}) > 25
    for key, _ in specs:
        fmt = response_format(key)["response_format"]
        assert fmt["type"] == "json_schema" and fmt["json_schema"]["schema"] is SCHEMAS[key.split("/")[0]]


def test_valid_answers_parse_with_the_schemas_keys_in_order():
    good = '{"title": "Poetry Slam", "date": "2026-03-04", "city": "Oslo", "attendees": 40, "free": true}'
    assert valid("event/3", good)
    assert not valid("event/3", good[:-1])  # cut short
    assert not valid("person/0", good)  # another schema's keys


def test_the_in_process_forced_rows_benchmark_runs_and_checks_its_texts(tmp_path):
    """bench/bench_forced_rows.py, tiny: every configuration runs and its texts equal policy off's."""
    import subprocess
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "forced_rows.json"
    run = subprocess.run([sys.executable, str(root / "bench" / "bench_forced_rows.py"), "--batch", "2", "--rounds", "1",
                          "--requests", "2", "--max-tokens", "24", "--out", str(out)],
                         cwd=root, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["same_text"] and len(result["rows"]) == 5 and out.with_suffix(".png").exists()
    grammar = next(r for r in result["rows"] if r["config"] == "grammar")
    assert grammar["drafted"] > 0 and grammar["accepted"] > 0
