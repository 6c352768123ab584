"""python-pt's container argv, and the Apptainer definition's content (Apptainer is not installable here)."""

from __future__ import annotations

import sys
from pathlib import Path

from csrun.launch.container import UNSET_FOR_CONTAINER, container_plan, find_runtime, gpus_visible
from csrun.site import SiteConfig

REPO = Path(__file__).resolve().parents[2]
IMAGE_SITE = SiteConfig(image="/images/csrun.sif", mount_dirs=("/data", "/scratch"))


def test_image_and_runtime_give_apptainer_exec_with_binds() -> None:
    plan = container_plan(["run.py", "--mode", "train"], IMAGE_SITE, {}, runtime="/usr/bin/apptainer", gpus=False, cwd="/work")
    assert plan.argv == ["/usr/bin/apptainer", "exec", "--bind", "/data,/scratch", "/images/csrun.sif", "python3", "run.py", "--mode", "train"]
    assert plan.unset == () and plan.notices == []


def test_gpus_add_nv() -> None:
    plan = container_plan(["x.py"], IMAGE_SITE, {}, runtime="singularity", gpus=True, cwd="/work")
    assert plan.argv[:3] == ["singularity", "exec", "--nv"]


def test_host_variables_are_unset_saying_so() -> None:
    env = {"PYTHONPATH": "/host/lib", "LD_LIBRARY_PATH": "/host/so", "HOME": "/root"}
    plan = container_plan(["x.py"], IMAGE_SITE, env, runtime="apptainer", gpus=False, cwd="/work")
    assert plan.unset == ("PYTHONPATH", "LD_LIBRARY_PATH")
    assert plan.notices == ["python-pt: unset PYTHONPATH, LD_LIBRARY_PATH for the container"]
    assert set(plan.unset) <= set(UNSET_FOR_CONTAINER)


def test_only_cwd_bound_warns() -> None:
    site = SiteConfig(image="/i.sif", mount_dirs=("/work",))
    plan = container_plan(["x.py"], site, {}, runtime="apptainer", gpus=False, cwd="/work")
    assert any("the only bind is the current directory" in n for n in plan.notices)


def test_no_image_or_no_runtime_runs_this_python_with_one_notice() -> None:
    plan = container_plan(["x.py"], SiteConfig(), {"PYTHONPATH": "/keep"}, runtime="apptainer", gpus=False, cwd="/w")
    assert plan.argv == [sys.executable, "x.py"] and plan.unset == ()
    assert len(plan.notices) == 1 and "no container image configured" in plan.notices[0]
    plan = container_plan(["x.py"], IMAGE_SITE, {}, runtime=None, gpus=False, cwd="/w")
    assert plan.argv == [sys.executable, "x.py"]
    assert "no apptainer or singularity on PATH for image /images/csrun.sif" in plan.notices[0]


def test_runtime_prefers_apptainer() -> None:
    assert find_runtime(lambda n: f"/bin/{n}") == "/bin/apptainer"
    assert find_runtime(lambda n: "/bin/singularity" if n == "singularity" else None) == "/bin/singularity"
    assert find_runtime(lambda n: None) is None


def test_gpus_visible_reads_dev_and_cuda_visible_devices(tmp_path: Path) -> None:
    assert not gpus_visible({}, tmp_path)
    (tmp_path / "nvidia0").touch()
    assert gpus_visible({}, tmp_path)
    assert not gpus_visible({"CUDA_VISIBLE_DEVICES": ""}, tmp_path)


def test_definition_builds_python311_torch_mpi_and_csrun() -> None:
    text = (REPO / "sif" / "csrun.def").read_text()
    header = dict(line.split(":", 1) for line in text.splitlines() if line.split(":", 1)[0] in ("Bootstrap", "From"))
    assert header["Bootstrap"].strip() == "docker" and header["From"].strip().startswith("python:3.11")
    post = text.split("\n%post", 1)[1].split("\n%", 1)[0]
    for needle in ("torch==2.13.0", "mpich", "mpi4py", "/opt/csrun[all]"):
        assert needle in post
    files = text.split("\n%files", 1)[1].split("\n%", 1)[0]
    for path in ("pyproject.toml", "README.md", "csrun", "configs"):
        assert (REPO / path).exists() and f"{path} /opt/csrun/{path}" in files
    assert "%test" in text and 'grep -q "Python 3.11"' in text


def test_multi_task_jobs_run_under_the_mpi4py_runner() -> None:
    plan = container_plan(["run.py", "--x"], SiteConfig(), {}, runtime=None, gpus=False, cwd="/w", multi_task=True)
    assert plan.argv == [sys.executable, "-m", "mpi4py", "run.py", "--x"]
    plan = container_plan(["-c", "pass"], IMAGE_SITE, {}, runtime="apptainer", gpus=False, cwd="/w", multi_task=True)
    assert plan.argv[-5:] == ["python3", "-m", "mpi4py", "-c", "pass"]
    plan = container_plan(["--version"], SiteConfig(), {}, runtime=None, gpus=False, cwd="/w", multi_task=True)
    assert plan.argv == [sys.executable, "--version"]
