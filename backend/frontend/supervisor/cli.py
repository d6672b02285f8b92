"""python -m backend.frontend.supervisor: the arguments, then everything before Triton starts, in
order: the served configuration resolved once (backend/served.py), what it names built, leftovers
of a crashed predecessor cleaned, and the Supervisor run. What stops a launch is a LaunchError
(errors.py): printed, exit 2, nothing started."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ...served import from_repository
from ...server_config import unknown_env
from ..edge.proxy import MAX_BODY_BYTES, MAX_DEPTH, READ_TIMEOUT_S
from . import __doc__ as OVERVIEW
from .build_served import build_what_is_served
from .errors import LaunchError
from .lifecycle import Supervisor
from .processes import stop_orphan_servers
from .stubs import reap_stubs
from .triton_command import ROOT, Ports, server_command


def arguments(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=f"python -m {__package__}", description=OVERVIEW,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--http-port", type=int, default=int(os.environ.get("HTTP_PORT", 8000)))
    ap.add_argument("--grpc-port", type=int, default=int(os.environ.get("GRPC_PORT", 8001)))
    ap.add_argument("--metrics-port", type=int, default=int(os.environ.get("METRICS_PORT", 8002)))
    ap.add_argument("--model-repository", type=Path, default=ROOT / "model_repository")
    ap.add_argument("--bind-address", default=os.environ.get("SPECSERVE_BIND_ADDRESS") or "127.0.0.1",
                    help="address the HTTP edge, gRPC and metrics listen on (Triton's own HTTP stays on loopback)")
    ap.add_argument("--max-body-bytes", type=int, default=int(os.environ.get("SPECSERVE_MAX_BODY_BYTES") or MAX_BODY_BYTES),
                    help="largest HTTP request body (413 beyond)")
    ap.add_argument("--http-read-timeout", type=float,
                    default=float(os.environ.get("SPECSERVE_HTTP_READ_TIMEOUT_S") or READ_TIMEOUT_S),
                    help="seconds a client has to send a request's headers, and again its body (idle "
                         "keep-alive connections close after as long)")
    ap.add_argument("--max-json-depth", type=int, default=int(os.environ.get("SPECSERVE_MAX_JSON_DEPTH") or MAX_DEPTH),
                    help="deepest JSON nesting in an HTTP request (400 beyond)")
    ap.add_argument("--start-timeout", type=float, default=float(os.environ.get("SPECSERVE_START_TIMEOUT_S") or 0),
                    help="seconds a starting Triton has to become ready before it is restarted (0: 4x the slowest "
                         "load measured, at least 60 s; 600 s for the first)")
    return ap.parse_args(argv)


def prepare(args: argparse.Namespace) -> Supervisor:
    """Everything before Triton starts -> the Supervisor that runs it; LaunchError if it cannot."""
    try:  # the one reading of the served configuration: Triton's models, the edge and the OpenAI API get it
        served = from_repository(args.model_repository)
    except Exception as e:  # noqa: BLE001 - unreadable or wrong: refused before anything starts, not when Triton loads it
        raise LaunchError(f"the served configuration ({args.model_repository / 'llm' / 'config.pbtxt'} and "
                          f"SPECSERVE_*) cannot be served: {e}") from e
    build_what_is_served(served)
    ports = Ports(args.http_port, args.grpc_port, args.metrics_port)
    cmd = server_command(args.model_repository, ports, bind=args.bind_address)
    if stop_orphan_servers(ports):
        print("stopped a tritonserver a killed supervisor left on these ports", flush=True)
    if reap_stubs():
        print("killed Python-backend stubs a crashed server left behind", flush=True)
    print(f"Starting Triton on {args.bind_address} — HTTP {ports.http}, gRPC {ports.grpc}, metrics {ports.metrics}; "
          f"model 'llm' (also 'ensemble', 'tensorrt_llm_bls'; unary 'llm_unary'; token-level 'tensorrt_llm'); OpenAI API at "
          f"http://127.0.0.1:{ports.http}/v1. Try:\n  curl -s -X POST 127.0.0.1:{ports.http}/v2/models/llm/generate "
          "-d '{\"text_input\": \"The capital of France is\", \"max_tokens\": 16}'", flush=True)
    return Supervisor(cmd, served, ports, args.max_body_bytes, args.max_json_depth,
                      admin_key=os.environ.get("SPECSERVE_ADMIN_KEY"), bind=args.bind_address,
                      read_timeout_s=args.http_read_timeout, start_timeout_s=args.start_timeout)


def main(argv=None) -> int:
    args = arguments(argv)
    for message in unknown_env():  # a misspelt setting would otherwise be silently ignored
        print(message, flush=True)
    try:
        supervisor = prepare(args)
    except LaunchError as e:
        print(e, file=sys.stderr, flush=True)
        return 2
    return supervisor()
