"""Under csrun_wse --emulator: the chief connects to CS_IP and records it, and the process ids of the
cs_emulator processes that hold its job's token (its job's emulator); exits with argv[2]."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

from csrun.cluster import cluster_info


def emulators_with(token: str) -> list[int]:
    """The cs_emulator processes whose environment holds ``token``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if b"csrun.cli.cs_emulator" in (entry / "cmdline").read_bytes() and \
                    f"CSRUN_EMULATOR_TOKEN={token}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except (OSError, ValueError):
            continue
    return found


def main() -> int:
    out, code = Path(sys.argv[1]), int(sys.argv[2])
    info = cluster_info()
    record = {"rank": info.rank, "node": info.node_name, "cs_ip": os.environ.get("CS_IP"), "has_token": bool(os.environ.get("CSRUN_EMULATOR_TOKEN"))}
    if info.is_chief:
        host, port = os.environ["CS_IP"].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10):
            record["connected"] = True
        record["emulator_pids"] = emulators_with(os.environ["CSRUN_EMULATOR_TOKEN"])
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank_{info.rank}.json").write_text(json.dumps(record))
    return code if info.is_chief else 0


if __name__ == "__main__":
    sys.exit(main())
