"""csrun_cpu / csrun_wse / python-pt called in-process: messages, exit codes, dry runs.

Dry runs that need "a Slurm" use fake srun/scontrol/sinfo scripts on PATH: they only answer
the probe; nothing here runs a job (the real-cluster tests are in tests/slurm).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from csrun.cli import csrun_cpu, csrun_wse


@pytest.fixture()
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "fake-slurm"
    folder.mkdir()
    scripts = {
        "srun": "#!/bin/sh\nexit 99\n",
        "scontrol": "#!/bin/sh\necho 'Slurmctld(primary) at fake is UP'\n",
        "sinfo": "#!/bin/sh\necho 8\n",
    }
    for name, text in scripts.items():
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    return folder


def test_cpu_dry_run_prints_running_line(fake_slurm: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert csrun_cpu.main(["--dry-run", "python-pt", "run.py"]) == 0
    out = capsys.readouterr().out
    assert out.strip() == "Running: srun --job-name=csrun_cpu:run.py --nodes=1 --ntasks=1 --exclusive --cpus-per-task=1 --exclude=cs-chief python-pt run.py"


def test_cpu_exclude_gres_false_and_mount_dirs(fake_slurm: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert csrun_cpu.main(["--exclude_gres=False", "--mount_dirs", "/data", "--dry-run", "true"]) == 0
    assert "--exclude" not in capsys.readouterr().out


def test_wse_dry_run_legacy_example(fake_slurm: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = csrun_wse.main(["--total-nodes=5", "--single_task_nodes", "2", "--tasks-per-node", "4", "--dry-run", "python-pt", "run.py"])
    assert code == 0
    out = capsys.readouterr().out
    assert out.startswith("Launching: srun --unbuffered --kill-on-bad-exit --quit-on-interrupt --mpi=pmi2 --job-name=csrun_wse:run.py --nodes=1 --tasks-per-node=1")
    assert out.count(" : ") == 2


def test_wse_works_out_cpus_from_node_size(fake_slurm: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert csrun_wse.main(["--tasks-per-node", "4", "--dry-run", "true"]) == 0
    assert "--tasks-per-node=4 --cpus-per-task=2" in capsys.readouterr().out
    assert csrun_wse.main(["--cpus-per-task", "8", "--dry-run", "true"]) == 0
    assert "--tasks-per-node=1 --cpus-per-task=8" in capsys.readouterr().out


def test_wse_single_task_nodes_message(fake_slurm: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert csrun_wse.main(["--total-nodes", "3", "--single-task-nodes", "3", "true"]) == 2
    assert "ERROR: '--single-task-nodes' (3) must be less than the number of nodes (3)" in capsys.readouterr().err


@pytest.mark.parametrize("main", [csrun_cpu.main, csrun_wse.main])
def test_unknown_option_is_an_error_not_a_warning(main, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    assert main(["--frobnicate", "true"]) == 2
    err = capsys.readouterr().err
    assert "unknown option '--frobnicate'" in err and "Traceback" not in err


@pytest.mark.parametrize("main", [csrun_cpu.main, csrun_wse.main])
def test_no_command_is_an_error(main, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    assert main([]) == 2
    assert "no command given" in capsys.readouterr().err


@pytest.mark.parametrize("main", [csrun_cpu.main, csrun_wse.main])
def test_help_lists_every_option(main, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "--mount-dirs" in out and "--dry-run" in out and "--def_gres_node" in out


@pytest.mark.parametrize("query, expected", [("--def_gres_node", "cs-chief"), ("--def_gres", "cs:1"), ("--def_cpus", "1"), ("--singularity", "")])
def test_def_queries_print_the_site_setting(query: str, expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert csrun_cpu.main([query]) == 0
    assert capsys.readouterr().out == expected + "\n"


def test_bad_site_config_exits_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "site.yaml"
    bad.write_text("gres: cs:1\n")
    monkeypatch.setenv("CSRUN_SITE_CONFIG", str(bad))
    assert csrun_wse.main(["--dry-run", "true"]) == 2
    err = capsys.readouterr().err
    assert "site.yaml: gres: unknown key." in err
    assert "gres_resource (default 'cs:1')" in err and "Traceback" not in err


def test_wait_without_sbatch_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert csrun_cpu.main(["--wait", "true"]) == 2
    assert "--wait only goes with --use-sbatch" in capsys.readouterr().err


def test_bad_time_limit_is_refused(fake_slurm: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert csrun_cpu.main(["--use-sbatch", "--time", "soon", "true"]) == 2
    assert "--time: 'soon' is not a Slurm time limit" in capsys.readouterr().err


def test_python_pt_without_image_says_so_and_runs_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    import subprocess
    import sys

    out = tmp_path / "out.txt"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "CSRUN_IMAGE": ""}
    done = subprocess.run([sys.executable, "-m", "csrun.cli.python_pt", "-c", f"import sys; open({str(out)!r},'w').write(sys.executable); sys.exit(7)"], env=env, capture_output=True, text=True)
    assert done.returncode == 7
    assert out.read_text() == sys.executable
    assert done.stderr.count("python-pt: no container image configured") == 1
