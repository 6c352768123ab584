"""A package gate shaped like the R1.x Model Zoo's (written here): every legacy import inside one
``try/except ImportError`` that falls back to a CPU stub. Prints what it got, as JSON."""

import json
import sys

try:
    import cerebras.framework.torch as cbtorch
    import torch_xla.utils.utils as xu
    from cerebras.framework.torch import amp
    from cerebras.framework.torch.core import cb_model as cm
    from cerebras.framework.torch.core import modes, name_scope
    from cerebras.pb.stack.autogen_pb2 import AP_DISABLED
    from cerebras.workflow.python.cs_perf_analyzer import AssessBottlenecks, locate_csperf_log

    try:  # the zoo's loss_utils: R1.6's cbtorch.utils first, the appliance's cerebras_pytorch only if it fails
        from cerebras.framework.torch.utils import extract_loss
    except ImportError:
        from cerebras_pytorch.utils import extract_loss  # noqa: F401

    FELL_BACK = False
except ImportError:
    FELL_BACK = True

if FELL_BACK:
    print(json.dumps({"fell_back": True}))
else:
    with name_scope("block"):
        pass
    print(json.dumps({
        "fell_back": False,
        "cbtorch": cbtorch.Session.__module__, "amp": amp.GradScaler.__module__, "cm": cm.__name__,
        "modes": [modes.TRAIN, modes.EVAL, modes.TRAIN_AND_EVAL], "ap": AP_DISABLED,
        "perf": locate_csperf_log("."), "assess": AssessBottlenecks.__module__,
        "xla": len(xu.SampleGenerator(data=(1, 2), sample_count=3)), "num_tasks": cm.num_tasks(),
        "loader": cbtorch.data.DataLoader.__name__, "optimizer": cbtorch.optim.Optimizer.__name__,
        "extract_loss": extract_loss.__module__, "two_x_imported": "csrun.pytorch" in sys.modules,
    }))
