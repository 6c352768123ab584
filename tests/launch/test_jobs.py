"""csrun.launch.jobs and ``csrun status`` / ``csrun logs`` against a fake ``scontrol`` (issue 34
item 6): parsing, a het job's state and exit code, the command's code from submitit's result
file, tailing a log, the final line, an unknown id. tests/slurm/test_job_follow_on_cluster.py
does the same on the real cluster."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from csrun.cli import csrun_main
from csrun.launch import jobs
from csrun.launch.jobs import JobStatus, LogTail, exit_code_of, final_line, parse_show_job, status_from_records

HET = """\
JobId=500 HetJobId=500 HetJobOffset=0 JobName=csrun_wse:run.py JobState={s0} Reason=None Restarts=0 BatchFlag=1 ExitCode={c0} RunTime=00:01:02 NodeList=cs-chief StdErr={log}/500/500_log.err StdIn=/dev/null StdOut={log}/500/500_log.out Power=
JobId=501 HetJobId=500 HetJobOffset=1 JobName=csrun_wse:run.py JobState={s1} Reason=None Restarts=0 BatchFlag=1 ExitCode={c1} RunTime=00:01:02 NodeList=cs-w[1-2] StdErr={log}/501/501_log.err StdIn=/dev/null StdOut={log}/501/501_log.out Power=
"""


def het(s0: str = "RUNNING", s1: str = "RUNNING", c0: str = "0:0", c1: str = "0:0", log: str = "/logs") -> str:
    return HET.format(s0=s0, s1=s1, c0=c0, c1=c1, log=log)


@pytest.fixture()
def fake_scontrol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``scontrol --oneliner show job ID`` prints ``<dir>/ID.txt``; an id without a file is unknown."""
    folder = tmp_path / "fake-slurm"
    folder.mkdir()
    script = folder / "scontrol"
    script.write_text(f'#!/bin/sh\nf="{folder}/$4.txt"\n[ -f "$f" ] && exec cat "$f"\n'
                      'echo "slurm_load_jobs error: Invalid job id specified" >&2\nexit 1\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    return folder


def test_a_het_jobs_records_make_one_status() -> None:
    st = status_from_records(parse_show_job(het(s0="RUNNING", s1="PENDING")), "500")
    assert (st.job_id, st.name, st.state, st.exit_code) == ("500", "csrun_wse:run.py", "RUNNING", None)
    assert st.nodes == "cs-chief,cs-w[1-2]" and st.elapsed == "00:01:02" and not st.ended
    assert st.log_folder == Path("/logs/500") and st.stdout == Path("/logs/500/500_log.out")
    ended = status_from_records(parse_show_job(het(s0="FAILED", s1="CANCELLED", c0="3:0", c1="0:15")), "500")
    assert (ended.state, ended.exit_code) == ("FAILED", 3), "the batch script's code (component 0) comes first"
    killed = status_from_records(parse_show_job(het(s0="COMPLETED", s1="CANCELLED", c0="0:0", c1="0:9")), "500")
    assert (killed.state, killed.exit_code) == ("CANCELLED", 137)


def test_a_path_with_a_space_and_a_pending_reason() -> None:
    text = "JobId=7 JobName=x JobState=PENDING Reason=Resources ExitCode=0:0 NodeList=(null) StdOut=/my logs/7/7_0_log.out StdErr=/my logs/7/7_0_log.err\n"
    st = status_from_records(parse_show_job(text), "7")
    assert st.stdout == Path("/my logs/7/7_0_log.out") and st.reason == "Resources" and st.nodes == ""


def test_a_csrun_cpu_jobs_exit_code_is_the_commands(tmp_path: Path) -> None:
    folder = tmp_path / "9"
    folder.mkdir()
    (folder / "9_0_exit_code").write_text("4\n")
    text = f"JobId=9 JobName=csrun_cpu:bash JobState=COMPLETED ExitCode=0:0 NodeList=cs-w1 StdOut={folder}/9_0_log.out StdErr={folder}/9_0_log.err\n"
    st = status_from_records(parse_show_job(text), "9")
    assert (st.state, st.exit_code, exit_code_of(st)) == ("COMPLETED", 4, 4)
    (folder / "9_0_exit_code").write_text("cos(0)\n")  # not a number: no code from it
    assert jobs.command_exit_code(folder, "9") is None
    (folder / "9_0_result.pkl").write_bytes(b"cos\nsystem\n(S'touch pwned'\ntR.")  # submitit's pickle: never read
    assert jobs.command_exit_code(folder, "9") is None and not Path("pwned").exists()


def test_final_line_and_exit_code() -> None:
    base = dict(job_id="5", name="n", nodes="", elapsed="", reason="", restarts=0, log_folder=None, stdout=None, stderr=None)
    assert final_line("csrun_wse", JobStatus(state="COMPLETED", exit_code=0, **base)) == "csrun_wse: job 5 COMPLETED, exit code 0"  # type: ignore[arg-type]
    assert exit_code_of(JobStatus(state="TIMEOUT", exit_code=0, **base)) == 1  # type: ignore[arg-type]
    assert exit_code_of(JobStatus(state="CANCELLED", exit_code=143, **base)) == 143  # type: ignore[arg-type]


def test_a_log_tail_gives_whole_lines_and_rereads_a_truncated_file(tmp_path: Path) -> None:
    log, out = tmp_path / "x.log", io.StringIO()
    tail = LogTail(log)
    assert not tail.pump(out)
    log.write_text("one\ntw")
    assert tail.pump(out) and out.getvalue() == "one\n"
    with log.open("a") as f:
        f.write("o\nthree")
    tail.pump(out)
    assert out.getvalue() == "one\ntwo\n"
    tail.pump(out, final=True)
    assert out.getvalue() == "one\ntwo\nthree\n"
    log.write_text("new\n")
    tail.pump(out)
    assert out.getvalue().endswith("three\nnew\n")


def test_follow_streams_until_the_job_ends(fake_scontrol: Path, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    (logs / "500").mkdir(parents=True)
    (fake_scontrol / "500.txt").write_text(het(log=str(logs)))
    out, err = io.StringIO(), io.StringIO()
    steps = iter([("step 1\n", "warn\n", het(log=str(logs))), ("step 2\n", "", het(s0="COMPLETED", s1="COMPLETED", log=str(logs)))])

    def sleep(_: float) -> None:  # the job writes and moves on while follow() sleeps
        line, warning, record = next(steps)
        with (logs / "500" / "500_log.out").open("a") as f:
            f.write(line)
        with (logs / "500" / "500_log.err").open("a") as f:
            f.write(warning)
        (fake_scontrol / "500.txt").write_text(record)

    st = jobs.follow("500", out=out, err=err, poll_s=0, sleep=sleep)
    assert (st.state, st.exit_code) == ("COMPLETED", 0)
    assert out.getvalue() == "step 1\nstep 2\n" and err.getvalue() == "warn\n"


def test_status_asked_with_a_components_id_shows_the_whole_job(fake_scontrol: Path) -> None:
    (fake_scontrol / "500.txt").write_text(het())
    (fake_scontrol / "501.txt").write_text(het().splitlines()[1] + "\n")
    assert jobs.job_status("501").job_id == "500" and jobs.job_status("501").nodes == "cs-chief,cs-w[1-2]"


def test_csrun_status_and_logs(fake_scontrol: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    logs = tmp_path / "logs"
    (logs / "500").mkdir(parents=True)
    (logs / "500" / "500_log.out").write_text("Train: step 20\n")
    (logs / "500" / "500_log.err").write_text("a warning\n")
    (fake_scontrol / "500.txt").write_text(het(s0="FAILED", s1="FAILED", c0="3:0", log=str(logs)))
    assert csrun_main.main(["status", "500"]) == 0
    out = capsys.readouterr().out
    for row in ("job:        500", "state:      FAILED", "exit code:  3", "nodes:      cs-chief,cs-w[1-2]",
                "elapsed:    00:01:02", f"log folder: {logs / '500'}"):
        assert row in out, out
    assert csrun_main.main(["logs", "500"]) == 0
    got = capsys.readouterr()
    assert (got.out, got.err) == ("Train: step 20\n", "a warning\n")
    assert csrun_main.main(["logs", "500", "--follow"]) == 3
    assert capsys.readouterr().out.endswith("Train: step 20\ncsrun: job 500 FAILED, exit code 3\n")


@pytest.mark.parametrize("argv", [["status", "424242"], ["logs", "424242"], ["logs", "424242", "--follow"]])
def test_an_unknown_job_is_one_line_and_exit_1(fake_scontrol: Path, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    assert csrun_main.main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("csrun: error: no job 424242 known to Slurm") and err.count("\n") == 1 and "Traceback" not in err


def test_a_word_that_is_no_job_id_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert csrun_main.main(["status", "last"]) == 2
    assert "'last' is not a Slurm job id" in capsys.readouterr().err
