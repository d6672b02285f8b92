"""Triton's secrets kept off its command line (backend/frontend/supervisor/server_secrets.py,
argv_env.c); tests/integration/test_lifecycle.py reads a real Triton's command line."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from backend.frontend.supervisor.errors import LaunchError
from backend.frontend.supervisor.server_secrets import (UpstreamKeys, argv_env_library, fill_placeholders,
                                                        private_socket_path, server_secrets)
from backend.frontend.supervisor.triton_command import Ports, server_command


def test_argv_env_fills_placeholders_that_ps_does_not_show(tmp_path):
    library = argv_env_library(tmp_path)
    assert library is not None, "needs a C compiler"
    built = library.stat().st_mtime_ns
    assert argv_env_library(tmp_path) == library and library.stat().st_mtime_ns == built  # built once
    assert [f.name for f in tmp_path.iterdir()] == [library.name]
    show = ("import os, sys; print(sys.argv[1:], open('/proc/self/cmdline', 'rb').read().split(b'\\0')[3:5], "
            "os.environ.get('SPECSERVE_ARG_KEY'), os.environ.get('LD_PRELOAD'))")
    out = subprocess.run([sys.executable, "-c", show, "--key=a:@SPECSERVE_ARG_KEY@", "--port=@SPECSERVE_ARG_PORT@"],
                         env=dict(os.environ, LD_PRELOAD=str(library), SPECSERVE_ARG_KEY="s3cret", SPECSERVE_ARG_PORT="99"),
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == ("['--key=a:s3cret', '--port=99'] [b'--key=a:@SPECSERVE_ARG_KEY@', "
                           "b'--port=@SPECSERVE_ARG_PORT@'] None None"), out


def test_every_placeholder_of_tritons_command_line_has_its_secret(tmp_path, monkeypatch):
    """What the edge sends Triton (the keys) and where it finds it (the socket) are on Triton's
    command line as placeholders only, each filled by a value server_secrets hands over."""
    from backend.frontend.supervisor import triton_command
    binary = tmp_path / "pytriton" / "tritonserver" / "bin" / "tritonserver"
    binary.parent.mkdir(parents=True)
    binary.write_text("")
    monkeypatch.setattr(triton_command, "TRITON", tmp_path)
    keys = UpstreamKeys.fresh()
    cmd = server_command(Path("/m"), Ports(8000, 8001, 8002))
    values = server_secrets(tmp_path / "triton-http.sock", keys)
    filled = fill_placeholders(cmd, values)
    assert not any("@SPECSERVE_ARG_" in a for a in filled)
    assert not any(keys.admin in a or keys.internal in a for a in cmd)
    assert f"--http-address=unix:{tmp_path / 'triton-http.sock'}" in filled
    assert any(a.endswith(f"={keys.internal}") for a in filled) and any(a.endswith(f"={keys.admin}") for a in filled)


def test_launch_problems_are_launch_errors(tmp_path, monkeypatch):
    """The wing's one error path: the supervisor's main prints these and exits 2."""
    from backend.frontend.supervisor import triton_command
    monkeypatch.setattr(triton_command, "TRITON", tmp_path / "none")
    with pytest.raises(LaunchError, match="run scripts/setup.sh first"):
        server_command(Path("/m"), Ports(8000, 8001, 8002))
    with pytest.raises(LaunchError, match="too long for a Unix socket"):
        private_socket_path(tmp_path / ("d" * 120))


def test_a_socket_path_too_long_stops_the_launch_and_leaves_no_directory(tmp_path, monkeypatch):
    import tempfile

    from backend.frontend.supervisor.lifecycle import Supervisor
    from backend.server_config import ServerConfig
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    with pytest.raises(LaunchError, match="set TMPDIR shorter"):
        Supervisor([], ServerConfig(), Ports(1, 2, 3), 1 << 20, 32)
    assert list(deep.iterdir()) == []  # its private directory removed again
