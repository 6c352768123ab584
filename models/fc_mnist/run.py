"""fc_mnist: ``python run.py --mode train --params ../../configs/fc_mnist.yaml`` (flags: csrun.run)."""

import sys
from pathlib import Path

from csrun.run import run
from data import eval_input_fn, train_input_fn
from model import FcMnist, FcMnistConfig, FcMnistInputConfig, eval_metrics

if __name__ == "__main__":
    sys.exit(run(model_fn=lambda params: FcMnist(params.model), train_input_fn=train_input_fn,
                 eval_input_fn=eval_input_fn, model_config=FcMnistConfig, input_config=FcMnistInputConfig,
                 eval_metrics=eval_metrics, default_model_dir=str(Path(__file__).resolve().parent / "model_dir")))
