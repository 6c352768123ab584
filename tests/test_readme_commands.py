"""Every command the README shows runs as written (issue 34 item 3), so the README cannot drift.

The README's ``bash`` blocks are read, and each command runs from a fresh folder holding a copy of
the checkout's ``models/`` and ``configs/`` (outputs land there, never in the checkout), with
``bin/`` on PATH, as a newcomer would type it. The only changes: training runs are cut to a few
steps (``--max_steps``; the eval keeps its own length), and a background server (``... &``)
runs until the block ends. A command that needs something outside this machine is listed in
:data:`NOT_HERE` with the reason; the setup commands are what CI itself runs. Each must exit 0.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from tests.conftest import BIN, REPO

pytestmark = pytest.mark.timeout(900)

NOT_HERE = {
    "--cs_ip 10.0.0.5:9000": "a system at an address of the reader's own",
    "bin/csrun-setup --tests": "the suite itself (CI runs exactly this command)",
}
"""Commands (by a part of them) not run here, and why."""
STEPS = "20"


def readme_commands() -> list[list[str]]:
    """The README's ``bash`` blocks, each a list of commands (comments dropped)."""
    blocks = re.findall(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    found = []
    for block in blocks:
        lines = [line.split("  #", 1)[0].strip() for line in block.splitlines()]
        found.append([line for line in lines if line and not line.startswith("#")])
    return found


def steps_cut(argv: list[str]) -> list[str]:
    """A training run of run.py cut to a few steps (compiles and evals as they are)."""
    if any(a.endswith("run.py") for a in argv) and "train" in argv and not {"--compile_only", "--validate_only"} & set(argv):
        return [*argv, "--max_steps", STEPS]
    return argv


def start_server(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    """A README background server (``cs_emulator ... &``), once it says it is listening; its output
    is drained from then on. One that exits first (its port taken, say) fails the test with its words."""
    server = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert server.stdout is not None
    said = []
    for line in server.stdout:
        said.append(line)
        if " listening on " in line:
            threading.Thread(target=server.stdout.read, daemon=True).start()
            return server
    server.wait(timeout=30)
    raise AssertionError(f"{shlex.join(argv)} exited {server.returncode} before listening:\n{''.join(said)[-2500:]}")


def test_the_readme_shows_the_commands_this_test_runs() -> None:
    commands = [c for block in readme_commands() for c in block]
    assert any("csrun_wse" in c and "fc_mnist" in c for c in commands) and any("--compile_only" in c for c in commands)
    assert all(any(part in c for c in commands) for part in NOT_HERE), "a skipped command is gone: drop its entry"


def test_every_readme_command_runs_as_written(tmp_path: Path, slurm_env: dict[str, str]) -> None:
    work = tmp_path / "newcomer"
    for tracked in subprocess.run(["git", "ls-files", "models", "configs"], cwd=REPO, capture_output=True, text=True,
                                  check=True).stdout.split():
        (work / tracked).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / tracked, work / tracked)
    (work / ".venv").symlink_to(REPO / ".venv")  # what the setup command made
    (work / "bin").symlink_to(BIN)
    env = {**slurm_env, "PATH": f"{BIN}:{slurm_env['PATH']}", "OMP_NUM_THREADS": "1"}
    ran = []
    for block in readme_commands():
        servers: list[subprocess.Popen[bytes]] = []
        try:
            for command in block:
                if any(part in command for part in NOT_HERE):
                    continue
                background = command.endswith("&")
                for part in command.rstrip("&").split("&&"):
                    argv = shlex.split(part)
                    if argv[0] == "bin/csrun-setup":
                        continue  # CI ran the set-up
                    argv = steps_cut(argv)
                    if background:
                        servers.append(start_server(argv, work, env))
                        continue
                    done = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=400)
                    assert done.returncode == 0, f"{part.strip()}\n{done.stdout[-2500:]}\n{done.stderr[-2500:]}"
                    assert "Traceback" not in done.stdout + done.stderr, part
                    ran.append(part.strip())
        finally:
            for server in servers:
                server.terminate()
                server.wait(timeout=30)
    assert len(ran) >= 9, ran
