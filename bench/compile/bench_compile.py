"""Compile-time benchmark: csrun's compile vs a bare torch.export of the same model.

Run (from the repository root, with csrun installed):

    python bench/compile/bench_compile.py            # BERT-base MSL128 batch 256 + debug BERT
    python bench/compile/bench_compile.py --quick    # debug BERT only

For each model, in one process: a bare ``torch.export.export(model, (batch,), strict=False)``
in training mode, then ``csrun.compiler.compile_only`` into an empty model_dir (capture,
checks, placement, hashing, writing ``cs_<hash>/``), then a second ``compile_only`` with the
same inputs (the cache hit). Each timing is the best of ``--repeat`` runs, alternating bare
and csrun so machine noise hits both; the ratio is also given in process CPU time, which
other processes on a shared machine disturb less than wall time. Prints a markdown table with the ratios (target:
compile / bare export <= 1.5, cache hit < 1 s).

BERT-base here: vocab 30522, hidden 768, 12 layers, 12 heads, filter 3072, MSL 128, batch
256 (the reference config), gelu, dropout 0.1, MLM head tied to the embeddings plus an NSP
head; the inputs carry a padding mask. torch.export traces with fake tensors, so the batch
size costs no activation memory at capture time.
"""

from __future__ import annotations

import argparse
import gc
import shutil
import tempfile
import time

import torch
import torch.nn.functional as F
from torch import nn

from csrun.compiler import CompileSettings, compile_only, settings_from_params


class Bert(nn.Module):
    """A BERT pre-training model: embeddings, encoder with padding mask, MLM (tied) + NSP heads."""

    def __init__(self, *, vocab: int, hidden: int, layers: int, heads: int, filt: int, msl: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(msl, hidden)
        self.seg = nn.Embedding(2, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.drop = nn.Dropout(dropout)
        layer = nn.TransformerEncoderLayer(hidden, heads, filt, dropout=dropout, activation="gelu", batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.mlm_dense = nn.Linear(hidden, hidden)
        self.mlm_norm = nn.LayerNorm(hidden)
        self.mlm = nn.Linear(hidden, vocab)
        self.mlm.weight = self.tok.weight
        self.pooler = nn.Linear(hidden, hidden)
        self.nsp = nn.Linear(hidden, 2)

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        ids = batch["input_ids"]
        pos = torch.arange(ids.shape[1], device=ids.device)
        h = self.drop(self.norm(self.tok(ids) + self.pos(pos) + self.seg(batch["token_type_ids"])))
        h = self.encoder(h, src_key_padding_mask=batch["attention_mask"] == 0)
        m = self.mlm(self.mlm_norm(F.gelu(self.mlm_dense(h))))
        mlm_loss = F.cross_entropy(m.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)
        nsp_loss = F.cross_entropy(self.nsp(torch.tanh(self.pooler(h[:, 0]))), batch["next_sentence_label"])
        return {"loss": mlm_loss + nsp_loss, "mlm_loss": mlm_loss, "nsp_loss": nsp_loss}


def make_batch(batch: int, msl: int, vocab: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (batch, msl), generator=g)
    mask = torch.ones(batch, msl, dtype=torch.int64)
    mask[:, msl * 3 // 4:] = 0
    labels = torch.full_like(ids, -100)
    labels[:, :20] = ids[:, :20]
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids),
            "labels": labels, "next_sentence_label": torch.zeros(batch, dtype=torch.int64)}


PARAMS = {
    "model": {"mixed_precision": True},
    "optimizer": {"optimizer_type": "adamw", "weight_decay_rate": 0.01, "max_gradient_norm": 1.0,
                  "loss_scaling_factor": "dynamic",
                  "learning_rate": [{"scheduler": "Linear", "initial_learning_rate": 0.0, "end_learning_rate": 1e-4, "steps": 10000},
                                    {"scheduler": "Linear", "initial_learning_rate": 1e-4, "end_learning_rate": 0.0, "steps": 1000000}]},
}

CONFIGS = {
    "bert-base MSL128 b256": dict(vocab=30522, hidden=768, layers=12, heads=12, filt=3072, msl=128, batch=256),
    "bert debug MSL128 b16": dict(vocab=30522, hidden=128, layers=2, heads=2, filt=512, msl=128, batch=16),
}


def bench(name: str, cfg: dict, repeat: int, settings: CompileSettings) -> dict:
    torch.manual_seed(0)
    model = Bert(vocab=cfg["vocab"], hidden=cfg["hidden"], layers=cfg["layers"], heads=cfg["heads"], filt=cfg["filt"], msl=cfg["msl"])
    model.train()
    batch = make_batch(cfg["batch"], cfg["msl"], cfg["vocab"])
    bare, comp, bare_cpu, comp_cpu = [], [], [], []
    miss_dir = None
    for _ in range(repeat):
        gc.collect()
        t, c = time.perf_counter(), time.process_time()
        torch.export.export(model, (batch,), strict=False)
        bare.append(time.perf_counter() - t)
        bare_cpu.append(time.process_time() - c)
        d = tempfile.mkdtemp(prefix="csrun-bench-")
        gc.collect()
        t, c = time.perf_counter(), time.process_time()
        r = compile_only(model, batch, settings=settings, model_dir=d)
        comp.append(time.perf_counter() - t)
        comp_cpu.append(time.process_time() - c)
        if not r.ok:
            raise SystemExit("\n".join(p.render() for p in r.problems))
        if miss_dir:
            shutil.rmtree(miss_dir, ignore_errors=True)
        miss_dir, result = d, r
    hits = []
    for _ in range(repeat):
        t = time.perf_counter()
        h = compile_only(model, batch, settings=settings, model_dir=miss_dir)
        hits.append(time.perf_counter() - t)
        assert h.cache_hit and h.directory == result.directory
    t = time.perf_counter()
    slow = compile_only(model, batch, settings=settings, model_dir=miss_dir, reuse_by_source=False)
    hit_graph = time.perf_counter() - t
    assert slow.cache_hit
    shutil.rmtree(miss_dir, ignore_errors=True)
    n_params = sum(p.numel() for p in model.parameters())
    return {"name": name, "params": n_params, "bare": min(bare), "compile": min(comp), "hit": min(hits),
            "bare_cpu": min(bare_cpu), "compile_cpu": min(comp_cpu),
            "hit_graph": hit_graph, "est": result.estimate_json["est_samples_per_sec"],
            "util": result.plan_json["total_utilization"], "mem": result.plan.memory_utilization}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="debug-size BERT only")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    settings = settings_from_params(PARAMS, mode="train")
    torch.export.export(nn.Linear(2, 2), (torch.randn(1, 2),))  # warm torch.export's imports
    names = [n for n in CONFIGS if not args.quick or "debug" in n]
    rows = [bench(n, CONFIGS[n], args.repeat, settings) for n in names]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, best of {args.repeat}\n")
    print("| model | params | bare export s | csrun compile s | compile / export (wall) | compile / export (CPU time) "
          "| cache hit s | hit w/o source key s | est. samples/s | PE util. | SRAM use |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['name']} | {r['params'] / 1e6:.1f} M | {r['bare']:.2f} | {r['compile']:.2f} | {r['compile'] / r['bare']:.2f} "
              f"| {r['compile_cpu'] / r['bare_cpu']:.2f} | {r['hit']:.3f} | {r['hit_graph']:.2f} | {r['est']:,.0f} "
              f"| {r['util']:.1%} | {r['mem']:.1%} |")
    print("\nTargets: compile / export <= 1.5; cache hit < 1 s. Samples/s, utilization and SRAM use are wafer-model estimates.")


if __name__ == "__main__":
    main()
