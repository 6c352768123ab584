"""Where the local cluster may place a task, asked of the cluster itself (``scontrol``).

The cluster is shared and busy: other jobs hold nodes, and Slurm places a job on the nodes that
are free. A test that asserts where a task ran either pins it (``pinned_env``: the site's
``system_nodes``, so a cluster's chief keeps off the system nodes and takes the GRES node, its
systems the system nodes, MemoryX and the streamers the worker nodes) or asserts the rule Slurm
was given (the chief on a node that holds the GRES: :func:`gres_nodes`), never one node by name
where Slurm had a choice.
"""

from __future__ import annotations

import re
import subprocess

from csrun.site import load_site_config


def gres_nodes(env: dict[str, str]) -> set[str]:
    """The nodes that hold the system's GRES (the site's ``gres_resource``), as the cluster says."""
    name = load_site_config({}).gres_resource.split(":")[0]
    done = subprocess.run(["scontrol", "-o", "show", "nodes"], env=env, capture_output=True, text=True, timeout=120,
                          check=True)
    return {m.group(1) for line in done.stdout.splitlines()
            if (m := re.match(r"NodeName=(\S+)", line)) and re.search(rf"\bGres=\S*\b{re.escape(name)}:", line)}


def pinned_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the site's ``system_nodes`` set to every GRES node but the site's GRES node."""
    gres_node = load_site_config({}).gres_node
    return {**env, "CSRUN_SYSTEM_NODES": ",".join(sorted(gres_nodes(env) - {gres_node}))}
