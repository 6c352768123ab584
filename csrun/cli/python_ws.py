"""python-ws — the Python of the weight-streaming build: run a Python command in weight-streaming mode.

Usage (seed 004, with this repository's paths)::

    csrun_wse python-ws models/gpt2/run.py -m train -o gpt3_xl_pile -p configs/gpt3_xl.yaml --cs_ip $CS_IP --max_steps 2000
    csrun_cpu python-ws models/gpt2/run.py -m train -p configs/gpt3_xl.yaml --compile_only --shapes_only

Everything :mod:`csrun.cli.python_pt` does, with the weight-streaming build of the container:

- the image is the site's ``ws_image`` (``CSRUN_WS_IMAGE``), else its ``image``
  (``CSRUN_IMAGE``), run as ``apptainer exec [--nv] --env CSRUN_EXECUTION_STRATEGY=weight_streaming
  [--bind a,b] IMAGE python3 ARGS``; without an image or a runtime, the current Python
  (``sys.executable``), after one notice line saying why;
- the same ``--nv`` rule (NVIDIA GPUs visible, ``CUDA_VISIBLE_DEVICES``), the same binds (site
  ``mount_dirs`` plus the launcher's ``--mount-dirs``, as ``CSRUN_MOUNT_DIRS``), the same host
  variables unset for a container (``PYTHONPATH``, ``LD_LIBRARY_PATH``, ... :data:`~csrun.launch.container.UNSET_FOR_CONTAINER`),
  ``python -m mpi4py`` in a job of several tasks, notices from the chief only, exec;
- and it sets ``CSRUN_EXECUTION_STRATEGY=weight_streaming`` for the command (in its
  environment; in a container also as ``--env``): run.py then compiles in weight-streaming mode
  (weights in MemoryX, streamed onto the wafer one layer group at a time; see
  :mod:`csrun.program.execution` and :mod:`csrun.compiler.streaming`), unless its own
  ``--execution_strategy`` flag says otherwise. The run's numerics are those of pipelined mode.

Environment read: as python-pt (the site config, ``CSRUN_WS_IMAGE`` included). Set for the
command: ``CSRUN_EXECUTION_STRATEGY=weight_streaming``. Exit codes: the command's; 2 for a bad
site config; 127 when the program cannot be started.
"""

from __future__ import annotations

from csrun.cli.common import console_entry, run_cli
from csrun.launch.container import PYTHON_WS, exec_plan, plan_for_this_task
from csrun.site import load_site_config

PROG = PYTHON_WS.prog


def main(argv: list[str] | None = None) -> int:
    """python-ws's entry point (execs the command; returns only on error)."""
    return run_cli(PROG, lambda args: exec_plan(plan_for_this_task(args, load_site_config(), PYTHON_WS), PROG), argv)


console_main = console_entry(main)


if __name__ == "__main__":
    console_main()
