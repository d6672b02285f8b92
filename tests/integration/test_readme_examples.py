"""Every client example of the README and of docs/api.md, run as written against the live server
(only the ports changed: the test server's are free ones), prints generated text: the curl
commands (the code blocks' and those quoted in the text) and the Python snippets (Triton's gRPC
and HTTP clients, the OpenAI SDK). A raw prompt under greedy decoding may end at once on this instruct model and
print nothing; these tests catch an example that does."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [(ROOT / "README.md").read_text(), (ROOT / "docs" / "api.md").read_text()]
BLOCKS = [block for page in PAGES for block in re.findall(r"```(\w+)\n(.*?)```", page, re.S)]


def curl_commands() -> list:
    """Each `curl` command of the pages: in a bash block (across lines, up to where its quotes
    close and no backslash continues it), or quoted inline in the text."""
    commands = []
    for lang, body in BLOCKS:
        if lang != "bash":
            continue
        lines, current = body.splitlines(), None
        for line in lines:
            if current is None and line.lstrip().startswith("curl "):
                current = line
            elif current is not None:
                current += "\n" + line
            if current is not None and current.count("'") % 2 == 0 and not current.endswith("\\"):
                commands.append(current)
                current = None
    inline = [c for page in PAGES for c in re.findall(r"`(curl [^`]+)`", re.sub(r"```.*?```", "", page, flags=re.S))]
    return commands + inline


PYTHON = [body for lang, body in BLOCKS if lang == "python"]
CURLS = curl_commands()


def test_the_pages_have_the_examples_these_tests_run():
    assert len(CURLS) >= 4 and len(PYTHON) >= 3
    assert any("/v1" in p for p in PYTHON) and any("grpcclient" in p for p in PYTHON)
    readme = re.findall(r"```(\w+)\n(.*?)```", PAGES[0], re.S)  # the README's first screen: OpenAI, then Triton
    first_openai = next(i for i, (_, b) in enumerate(readme) if "/v1" in b)
    first_triton = next(i for i, (_, b) in enumerate(readme) if "/v2/models" in b)
    assert first_openai < first_triton


def on_server(text: str, server) -> str:
    return text.replace("127.0.0.1:8000", server.http).replace("127.0.0.1:8001", server.grpc)


def generated_tokens(output: str) -> int:
    """num_output_tokens of a /generate answer, of the last event of a stream, or of /infer; the
    usage's completion_tokens of an OpenAI answer."""
    events = [json.loads(line[5:]) for line in output.splitlines() if line.startswith("data:")]
    answer = events[-1] if events else json.loads(output)
    if "outputs" in answer:  # /infer
        return next(o["data"][0] for o in answer["outputs"] if o["name"] == "num_output_tokens")
    assert "error" not in answer, answer
    if "choices" in answer:  # the OpenAI API
        return answer["usage"]["completion_tokens"] if any(c["message"]["content"] for c in answer["choices"]) else 0
    return answer["num_output_tokens"]


@pytest.mark.parametrize("command", CURLS, ids=lambda c: c.split("\n")[0][:70])
def test_curl_example_generates_text(server, command):
    out = subprocess.run(["bash", "-c", on_server(command, server)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert generated_tokens(out.stdout) > 0, out.stdout


@pytest.mark.parametrize("code", PYTHON, ids=lambda c: re.search(r"^(?:import|from) (\S+)", c, re.M)[1])
def test_python_example_prints_generated_text(server, code):
    out = subprocess.run([sys.executable, "-c", on_server(code, server)], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    printed = re.sub(r"CompletionUsage\(.*\)", "", out.stdout)  # the OpenAI example prints the usage too
    for prompt in re.findall(r'"([^"]{12,})"', code):  # non-streaming Triton output echoes the prompt
        printed = printed.replace(prompt, "")
    assert re.search(r"\w", printed), out.stdout
    assert "completion_tokens=0" not in out.stdout
