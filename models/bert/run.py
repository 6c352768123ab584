"""BERT pretraining (MLM + NSP): ``run.py --mode train --params configs/bert_base_msl128.yaml``.

See README.md beside this file; flags and outputs: :mod:`csrun.run`.
"""

import sys
from pathlib import Path

from data import BertInputConfig, eval_input_dataloader, train_input_dataloader
from model import BertConfig, bert_eval_metrics, bert_model

from csrun.run import run

if __name__ == "__main__":
    sys.exit(run(model_fn=bert_model, train_input_fn=train_input_dataloader, eval_input_fn=eval_input_dataloader,
                 model_config=BertConfig, input_config=BertInputConfig, eval_metrics=bert_eval_metrics,
                 default_model_dir=str(Path(__file__).resolve().parent / "model_dir")))
