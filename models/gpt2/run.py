"""GPT-2 causal LM: ``run.py --mode train --params configs/gpt2_small.yaml``.

See README.md beside this file; flags and outputs: :mod:`csrun.run`.
"""

import sys
from pathlib import Path

from data import GptInputConfig, eval_input_dataloader, train_input_dataloader
from model import Gpt2Config, gpt2_eval_metrics, gpt2_model

from csrun.run import run

if __name__ == "__main__":
    sys.exit(run(model_fn=gpt2_model, train_input_fn=train_input_dataloader, eval_input_fn=eval_input_dataloader,
                 model_config=Gpt2Config, input_config=GptInputConfig, eval_metrics=gpt2_eval_metrics,
                 default_model_dir=str(Path(__file__).resolve().parent / "model_dir")))
