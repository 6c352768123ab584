"""GPT-2 / GPT-3 causal LM: ``run.py --mode train --params configs/gpt2_small.yaml`` (or ``gpt3_xl.yaml``).

GPT's own flag: ``--shapes_only`` (with ``--compile_only`` / ``--validate_only``): compile on
torch's meta device, see shapes_only.py. See README.md beside this file; flags and outputs:
:mod:`csrun.run`.
"""

import sys
from pathlib import Path

from data import GptInputConfig, eval_input_dataloader, train_input_dataloader
from model import Gpt2Config, gpt2_eval_metrics, gpt2_model
from shapes_only import compile_shapes_only, extra_args, wanted

from csrun.run import run

if __name__ == "__main__":
    if wanted(sys.argv[1:]):
        sys.exit(compile_shapes_only(sys.argv[1:], model_fn=gpt2_model, model_config=Gpt2Config,
                                     input_config=GptInputConfig, prog=Path(sys.argv[0]).name))
    sys.exit(run(model_fn=gpt2_model, train_input_fn=train_input_dataloader, eval_input_fn=eval_input_dataloader,
                 model_config=Gpt2Config, input_config=GptInputConfig, eval_metrics=gpt2_eval_metrics,
                 extra_args_parser_fn=extra_args,
                 default_model_dir=str(Path(__file__).resolve().parent / "model_dir")))
