"""Reading the server's metrics page (Prometheus text format) on the client side: benchmarks,
the soak script and the tests share this one parser."""
from __future__ import annotations

import re
import urllib.request
from typing import Dict, List, Tuple

SAMPLE = re.compile(r"^(\w+)(?:\{([^}]*)\})? (\S+)$")
LABEL = re.compile(r'(\w+)="([^"]*)"')


def samples(text: str) -> List[Tuple[str, Dict[str, str], float]]:
    """Every sample: (name, {label: value}, value).

    >>> samples('# HELP x\\nspecserve_kv_blocks{model="llm",state="free"} 12\\nup 1')
    [('specserve_kv_blocks', {'model': 'llm', 'state': 'free'}, 12.0), ('up', {}, 1.0)]
    """
    out = []
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m:
            out.append((m.group(1), dict(LABEL.findall(m.group(2) or "")), float(m.group(3))))
    return out


def specserve_series(text: str) -> Dict[str, float]:
    """The specserve_* samples keyed `name{label="value",...}` without the model / version
    labels every series carries (only the model `llm` publishes them).

    >>> specserve_series('specserve_kv_blocks{model="llm",state="free",version="1"} 12')
    {'specserve_kv_blocks{state="free"}': 12.0}
    """
    out = {}
    for name, labels, value in samples(text):
        if name.startswith("specserve_"):
            rest = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k not in ("model", "version"))
            out[name + (f"{{{rest}}}" if rest else "")] = value
    return out


def scrape(address: str) -> str:
    """The metrics page of a server, e.g. scrape("127.0.0.1:8002")."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
        return r.read().decode()
