"""Under csrun_wse --emulator: the chief connects to CS_IP and records it; exits with argv[2]."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

from csrun.cluster import cluster_info


def main() -> int:
    out, code = Path(sys.argv[1]), int(sys.argv[2])
    info = cluster_info()
    record = {"rank": info.rank, "node": info.node_name, "cs_ip": os.environ.get("CS_IP"), "has_token": bool(os.environ.get("CSRUN_EMULATOR_TOKEN"))}
    if info.is_chief:
        host, port = os.environ["CS_IP"].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10):
            record["connected"] = True
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank_{info.rank}.json").write_text(json.dumps(record))
    return code if info.is_chief else 0


if __name__ == "__main__":
    sys.exit(main())
