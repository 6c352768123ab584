"""BERT pretraining (MLM + NSP): ``run.py --mode train --params configs/bert_base_msl128.yaml``.

BERT's own flag: ``--shapes_only`` (with ``--compile_only`` / ``--validate_only``, which take it by
themselves): compile on torch's meta device, see shapes_only.py. See README.md beside this file;
flags and outputs: :mod:`csrun.run`.
"""

import sys
from pathlib import Path

from data import BertInputConfig, eval_input_dataloader, train_input_dataloader
from model import BertConfig, bert_eval_metrics, bert_model
from shapes_only import compile_shapes_only, extra_args, wanted

from csrun.run import run

if __name__ == "__main__":
    if wanted(sys.argv[1:]):
        sys.exit(compile_shapes_only(sys.argv[1:], model_fn=bert_model, model_config=BertConfig,
                                     input_config=BertInputConfig, prog=Path(sys.argv[0]).name))
    sys.exit(run(model_fn=bert_model, train_input_fn=train_input_dataloader, eval_input_fn=eval_input_dataloader,
                 model_config=BertConfig, input_config=BertInputConfig, eval_metrics=bert_eval_metrics,
                 extra_args_parser_fn=extra_args,
                 default_model_dir=str(Path(__file__).resolve().parent / "model_dir")))
