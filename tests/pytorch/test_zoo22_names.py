"""The names the 2.2.1 Model Zoo imports and calls: each imports, means what 2.2.1 meant, or
refuses in one line when used (never at import)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import csrun.pytorch as cstorch
from csrun.appliance import log, run_utils
from csrun.appliance.utils.file import create_symlink
from csrun.appliance.utils.units import convert_byte_unit
from csrun.driver import index_dtypes
from csrun.errors import UserError
from csrun.launch.environment import LEGACY_SHIM
from csrun.pytorch import metrics
from tests.conftest import base_env

pytestmark = pytest.mark.usefixtures("fresh")


def one_line(exc: pytest.ExceptionInfo[BaseException], *words: str) -> None:
    text = str(exc.value)
    assert "\n" not in text and isinstance(exc.value, UserError), text
    for word in words:
        assert word in text, text


def test_the_legacy_names_are_csruns_modules_beside_a_users_cerebras_namespace(tmp_path: Path) -> None:
    """The shim's ``cerebras`` is a namespace portion: the zoo's ``cerebras.modelzoo`` stays visible."""
    (tmp_path / "cerebras" / "userzoo").mkdir(parents=True)
    (tmp_path / "cerebras" / "userzoo" / "__init__.py").write_text("NAME = 'users own'\n")
    code = (
        "import sys; sys.path.append(sys.argv[1])\n"
        "import cerebras.pytorch as cstorch, cerebras_pytorch, csrun.pytorch\n"
        "import cerebras.pytorch.utils.data.data_executor as de, csrun.pytorch.utils.data.data_executor as de2\n"
        "import cerebras.appliance.run_utils as ru, csrun.appliance.run_utils as ru2\n"
        "import cerebras.framework.torch as cbtorch\n"
        "from cerebras.userzoo import NAME\n"
        "from cerebras.pytorch.distributed.cluster_resolver import ClusterSpec\n"
        "assert cstorch is cerebras_pytorch is csrun.pytorch and de is de2 and ru is ru2\n"
        "assert ClusterSpec is csrun.pytorch.distributed.ClusterSpec and NAME == 'users own'\n"
        "try:\n    import cerebras.pytorch.no_such_module\nexcept ModuleNotFoundError as e:\n"
        "    print('missing:', e.name)\n"
    )
    env = base_env(PYTHONPATH=f"{LEGACY_SHIM}{os.pathsep}{base_env().get('PYTHONPATH', '')}")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "missing: cerebras.pytorch.no_such_module"


IMPORT_TIME = [
    "core.modes.EVAL_ALL", "distributed.cluster_resolver.ClusterSpec", "distributed.cluster_resolver.TaskSpec",
    "distributed.service_resolver", "distributed.get_worker_state", "distributed.get_streaming_batch_size",
    "distributed.num_tasks", "distributed.is_streamer", "distributed.get_streaming_rank", "metrics.AccuracyMetric",
    "metrics.PerplexityMetric", "metrics.MeanMetric", "metrics.FBetaScoreMetric", "metrics.get_all_metrics",
    "utils.kernel.kernel_annotater", "utils.nest.visit_torch_tensors", "utils.nest.recurse_spec",
    "utils.tensorboard.SummaryWriter", "utils.data.data_executor.MbsSetting", "utils.data.compute_num_steps",
    "utils.data.SyntheticDataset", "utils.tracker.RateTracker", "sparse.map_sparsity_algorithm", "sparse.configure",
    "optim.configure_optimizer_params", "optim.configure_scheduler_params", "optim.configure_param_groups",
    "saver.pt_h5_saver.PyTorchH5Saver", "profiler.schedule", "profiler.profile", "name_scope", "use_cs",
    "__version__", "make_constant", "pol", "summarize_scalar", "summarize_tensor", "from_numpy", "to_numpy",
    "get_debug_name", "add_debug_name", "experimental.listener.create_listener",
    "experimental.run_implicit_autoregressive_loop", "nn.functional.one_hot", "amp.autocast", "amp.get_half_dtype",
]


@pytest.mark.parametrize("dotted", IMPORT_TIME)
def test_every_import_time_name_of_the_zoo_is_there(dotted: str) -> None:
    value: Any = cstorch
    for part in dotted.split("."):
        value = getattr(value, part)
    assert value is not None


@pytest.mark.parametrize("call, words", [
    (lambda: cstorch.sparse.configure({"type": "static"}), ["sparse.configure", "sparsity"]),
    (lambda: cstorch.sparse.map_sparsity_algorithm(algorithm="gmp"), ["map_sparsity_algorithm"]),
    (lambda: cstorch.saver.pt_h5_saver.PyTorchH5Saver(), ["PyTorchH5Saver", "cstorch.save"]),
    (lambda: cstorch.experimental.listener.create_listener(name="x"), ["create_listener", "step_closure"]),
    (lambda: cstorch.distributed.get_worker_state(), ["get_worker_state", "global step"]),
    (lambda: cstorch.profiler.schedule(start_step=1, end_step=3), ["op profiler", "op_profiler_config"]),
    (lambda: cstorch.pol(level=5), ["0, 1 and 2"]),
    (lambda: cstorch.backend("GPU"), ["GPU", "'CSX'"]),
    (lambda: cstorch.backend("CSX", enable_distributed=True), ["enable_distributed", "not an argument"]),
    (lambda: run_utils.get_debug_args("/some/debug_args.proto"), ["debug_args_path"]),
    (lambda: run_utils.set_ini(run_utils.DebugArgs(), ws_opt=True), ["runconfig.ini", "ws_opt"]),
    (lambda: run_utils.update_debug_args_from_keys(run_utils.DebugArgs(), {"a.b": 1}), ["runconfig.debug_args"]),
    (lambda: log.get_level_name("LOUD"), ["'LOUD'", "info"]),
    (lambda: cstorch.summarize_scalar("x", torch.tensor(1.0)), ["summarize_scalar", "executor"]),
])
def test_what_csrun_cannot_mean_refuses_in_one_line_when_used(call: Any, words: list[str]) -> None:
    with pytest.raises(UserError) as exc:
        call()
    one_line(exc, *words)


def test_cs_config_takes_the_zoos_defaults_and_refuses_what_it_cannot_honour() -> None:
    zoo = dict(num_csx=None, max_wgt_servers=None, mgmt_address=None, num_workers_per_csx=None,
               job_priority="p2", debug_args=run_utils.get_debug_args(None), disable_version_check=False,
               fabric_type_blacklist=None)
    config = cstorch.utils.CSConfig(**zoo)
    config.precision_opt_level = 1
    config.check(num_streamers=2)
    assert config.num_csx == 1 and config.num_workers_per_csx == 0
    for change, words in ((dict(precision_opt_level=2), ["precision_opt_level=2", "leave"]),
                          (dict(job_priority="p1"), ["job_priority='p1'", "Slurm"]),
                          (dict(fabric_type_blacklist=["x"]), ["fabric_type_blacklist"])):
        with pytest.raises(UserError) as exc:
            cstorch.utils.CSConfig(**{**zoo, **change}).check()
        one_line(exc, *words)
    limited = run_utils.get_debug_args(None)
    limited.debug_usr.worker_resource.memory_bytes = 4 << 30  # runconfig.wrk_memory_gi
    with pytest.raises(UserError) as exc:
        cstorch.utils.CSConfig(**{**zoo, "debug_args": limited}).check()
    one_line(exc, "debug_usr.worker_resource.memory_bytes", "--mem")


class Sized(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor(i)


def test_compute_num_steps_follows_the_runconfig_keys() -> None:
    loader = torch.utils.data.DataLoader(Sized(), batch_size=4, drop_last=True)  # 10 batches
    steps = cstorch.utils.data.compute_num_steps
    assert steps(loader, max_steps=25) == 25
    assert steps(loader, initial_step=20, max_steps=25) == 5  # a resumed run has what is left
    assert steps(loader, initial_step=20, num_steps=8, max_steps=25) == 5
    assert steps(loader, num_epochs=2) == 20 and steps(loader, num_epochs=2, steps_per_epoch=3) == 6
    assert steps(loader, num_steps=3, grad_accum_steps=2) == 6  # batches: steps times accumulation
    with pytest.raises(UserError) as exc:
        steps(loader, initial_step=25, max_steps=25)
    one_line(exc, "max_steps=25", "nothing to train")
    with pytest.raises(UserError) as exc:
        steps(loader, num_steps=3, num_epochs=1)
    one_line(exc, "exclude each other")


def test_metrics_compute_what_they_name() -> None:
    metrics.reset_for_tests()
    acc = metrics.AccuracyMetric(name="eval/accuracy")
    acc(labels=torch.tensor([1, 2, 3, 4], dtype=torch.int32), predictions=torch.tensor([1, 0, 3, 0]),
        weights=torch.tensor([1.0, 1.0, 1.0, 0.0]))
    assert float(acc) == pytest.approx(2 / 3)
    ppl = metrics.PerplexityMetric(name="eval/ppl")
    ppl(labels=torch.zeros(2, 3), loss=torch.tensor(6.0), weights=torch.ones(2, 3))
    assert float(ppl) == pytest.approx(math.exp(1.0))
    mean = metrics.MeanMetric(name="eval/mean")
    mean(value=torch.tensor([1.0, 3.0]), weight=torch.tensor([3.0, 1.0]))
    assert float(mean) == pytest.approx(1.5)
    labels, preds = torch.tensor([0, 1, 1, 2, 2, 2]), torch.tensor([0, 1, 2, 2, 2, 1])
    micro = metrics.FBetaScoreMetric(num_classes=3, average_type="micro", name="eval/f1")
    macro = metrics.FBetaScoreMetric(num_classes=3, average_type="macro", name="eval/f1")
    micro(labels=labels, predictions=preds)
    macro(labels=labels, predictions=preds)
    assert float(micro) == pytest.approx(4 / 6)  # micro F1 of single-label classes is the accuracy
    assert float(macro) == pytest.approx((1.0 + 0.5 + 2 / 3) / 3)
    assert [name for name, _ in metrics.get_all_metrics()] == ["eval/accuracy", "eval/ppl", "eval/mean", "eval/f1",
                                                               "eval/f1_1"]
    acc.reset()
    assert float(acc) == 0.0


def test_half_dtype_is_a_type_choice_and_get_half_dtype_a_torch_dtype() -> None:
    assert cstorch.amp.get_half_dtype() is torch.float16
    assert cstorch.amp.set_half_dtype(torch.bfloat16) is torch.bfloat16
    with cstorch.amp.autocast():  # no backend with mixed precision: changes nothing
        assert torch.nn.functional.linear(torch.ones(1, 2), torch.ones(2, 2)).dtype == torch.float32
    assert cstorch.amp.GradScaler(loss_scale="dynamic", init_scale=None, min_loss_scale=None,
                                  max_loss_scale=None, steps_per_increase=None).state_dict()


def test_the_backend_answers_the_zoos_questions(tmp_path: Path) -> None:
    backend = cstorch.backend("CPU", artifact_dir=str(tmp_path), mixed_precision=False)
    assert backend.backend_type.name == "CPU" and backend.backend_type == "CPU" and not backend.is_gpu
    assert backend.device.config.lazy_initialization is True
    loader = cstorch.utils.data.DataLoader(torch.utils.data.DataLoader, Sized(), batch_size=4, drop_last=True)
    assert loader.batch_size == 4 and not loader.is_restartable and loader.state_dict() == {}
    with pytest.raises(UserError) as exc:
        cstorch.utils.data.DataExecutor(loader, listeners=[object()])
    one_line(exc, "listeners", "step_closure")
    with pytest.raises(UserError) as exc:
        cstorch.utils.data.DataExecutor(loader, micro_batch_size="huge")
    one_line(exc, "micro_batch_size='huge'")
    executor = cstorch.utils.data.DataExecutor(loader, num_steps=3, activation_steps=1, micro_batch_size="auto")
    finals = [(executor.user_iteration, executor.on_final_iteration) for _ in executor]
    assert finals == [(1, False), (2, False), (3, True)]
    assert executor.profiler.rate_tracker.total_samples == 12
    assert cstorch.distributed.get_streaming_batch_size(64) == 64 and cstorch.distributed.num_tasks() == 1


def test_the_appliance_helpers() -> None:
    assert log.get_level_name("verbose") == log.VERBOSE and log.get_level_name("TRACE") == log.TRACE
    assert log.get_level_name("20") == 20
    assert convert_byte_unit(3 << 30, "GiB") == 3 and convert_byte_unit(2, "MB", src_unit="KB") == 0.002


def test_create_symlink_replaces_a_link_and_keeps_a_file(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    create_symlink(tmp_path / "latest", "a", target_is_directory=True)
    create_symlink(tmp_path / "latest", "b", target_is_directory=True)
    assert os.readlink(tmp_path / "latest") == "b"
    (tmp_path / "file").write_text("keep")
    with pytest.raises(FileExistsError):
        create_symlink(tmp_path / "file", "a")
    assert (tmp_path / "file").read_text() == "keep"


def test_int32_targets_and_indices_are_taken_where_torch_asks_for_int64() -> None:
    index_dtypes.install()
    logp = torch.randn(4, 5).log_softmax(1)
    t32 = torch.tensor([1, 0, 4, 2], dtype=torch.int32)
    assert torch.equal(F.nll_loss(logp, t32), F.nll_loss(logp, t32.long()))
    assert torch.equal(torch.nn.CrossEntropyLoss()(logp, t32), F.cross_entropy(logp, t32.long()))
    assert torch.equal(F.one_hot(t32, 5), F.one_hot(t32.long(), 5))
    assert torch.equal(torch.take_along_dim(logp, t32[:, None], 1), torch.take_along_dim(logp, t32.long()[:, None], 1))
