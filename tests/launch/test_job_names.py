"""Job names: ``csrun_wse:<script>`` / ``csrun_cpu:<script>`` on the srun step and the batch job;
a user's ``--job-name`` wins (issue 34 item 6). Argv building only; tests/slurm runs the jobs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from csrun.cli import csrun_cpu, csrun_wse
from csrun.launch.hetjob import hetjob_script
from csrun.launch.layout import wse_layout
from csrun.launch.srun import cpu_srun_argv, job_name, script_name, wse_srun_argv
from csrun.site import SiteConfig

SITE = SiteConfig(gres_node="cs-chief", gres_resource="cs:1")


@pytest.fixture()
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """srun/scontrol/sinfo that only answer csrun_wse's probe (a dry run needs "a Slurm")."""
    folder = tmp_path / "fake-slurm"
    folder.mkdir()
    for name, text in {"srun": "#!/bin/sh\nexit 99\n", "scontrol": "#!/bin/sh\necho 'Slurmctld(primary) at fake is UP'\n",
                       "sinfo": "#!/bin/sh\necho 8\n"}.items():
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    return folder


@pytest.mark.parametrize("command, script", [
    (["python-pt", "models/fc_mnist/run.py", "--mode", "train"], "run.py"),
    (["/opt/bin/python-pt", "-u", "train.py", "--params", "p.yaml", "other.py"], "train.py"),
    (["bash", "-c", "echo hi"], "bash"),
    (["/usr/bin/env"], "env"),
    (["python", "--flag=x.py", "-m", "mod"], "python"),
])
def test_script_name_is_the_first_python_file_else_the_program(command: list[str], script: str) -> None:
    assert script_name(command) == script


def test_job_name_is_launcher_and_script_and_the_users_name_wins() -> None:
    assert job_name("csrun_wse", ["python-pt", "run.py"]) == "csrun_wse:run.py"
    assert job_name("csrun_cpu", ["python-pt", "run.py"], "mine") == "mine"
    assert job_name("csrun_cpu", ["python-pt", "my run.py"]) == "csrun_cpu:my_run.py", "an #SBATCH line ends at a space"


def test_srun_lines_carry_the_name_and_leave_it_out_when_empty() -> None:
    layout = wse_layout(nodes=3, tasks_per_node=2, cpus_per_task=1, single_task_nodes=0, cyclic=False)
    line = wse_srun_argv(["cmd"], layout, SITE, name="csrun_wse:run.py")
    assert line.count("--job-name=csrun_wse:run.py") == 1 and line.index("--job-name=csrun_wse:run.py") < line.index(":")
    assert not [w for w in wse_srun_argv(["cmd"], layout, SITE) if w.startswith("--job-name")]
    assert cpu_srun_argv(["cmd"], SITE, exclude_gres=True, pty=True, name="n")[:3] == ["srun", "--job-name=n", "--pty"]
    script = hetjob_script(["python-pt", "run.py"], layout, SITE, job_name="csrun_wse:run.py", log_dir=Path("/logs"), time="", cwd="/w")
    assert "#SBATCH --job-name=csrun_wse:run.py\n" in script


def test_csrun_cpu_srun_line_is_named_after_the_script(capsys: pytest.CaptureFixture[str]) -> None:
    assert csrun_cpu.main(["--dry-run", "python-pt", "models/fc_mnist/run.py", "--mode", "train"]) == 0
    assert capsys.readouterr().out.startswith("Running: srun --job-name=csrun_cpu:run.py --nodes=1 ")
    assert csrun_cpu.main(["--job-name", "mine", "--dry-run", "python-pt", "run.py"]) == 0
    assert capsys.readouterr().out.startswith("Running: srun --job-name=mine --nodes=1 ")
    assert csrun_cpu.main(["--use-sbatch", "--dry-run", "python-pt", "run.py"]) == 0
    assert "job name csrun_cpu:run.py" in capsys.readouterr().out


def test_csrun_wse_step_and_batch_job_are_named(fake_slurm: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert csrun_wse.main(["--total-nodes", "2", "--dry-run", "python-pt", "models/fc_mnist/run.py"]) == 0
    assert " --mpi=pmi2 --job-name=csrun_wse:run.py --nodes=1 " in capsys.readouterr().out
    assert csrun_wse.main(["--job-name=exp7", "--dry-run", "python-pt", "run.py"]) == 0
    assert " --job-name=exp7 " in capsys.readouterr().out
    assert csrun_wse.main(["--use-sbatch", "--emulator", "--dry-run", "python-pt", "run.py"]) == 0
    assert "#SBATCH --job-name=csrun_wse:run.py\n" in capsys.readouterr().out, "named after the user's script, not the emulator wrapper"
