"""How much the synthetic teacher data's labels depend on the table-table dot products (by hand).

python benchmarks/synthetic_interactions.py [--num_samples 40000] [--max_rows 20000] [--seeds 3]

For each seed it rebuilds `--dataset synthetic` (training/data.py: `make_synthetic`) and scores the
labels with three logits: the teacher's own (the best any model can do: its AUC is the ceiling),
the teacher with every table-table dot product replaced by its mean over the data (the table-table
interaction taken out; the bottom MLP's dots with the tables and the dense part stay), and the bottom
output-only part (every dot product replaced by its mean). The gap between the first two is what
a model loses if the table-table interactions do not reach its top MLP.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from neuroshard.core.cli import config_from_args, run_main, step_parser  # noqa: E402
from neuroshard.core.config import flag  # noqa: E402
from neuroshard.core.errors import check_int  # noqa: E402
from neuroshard.training.data import make_synthetic, synthetic_teacher, teacher_logits  # noqa: E402
from neuroshard.training.train import auc  # noqa: E402


@dataclass
class InteractionsConfig:
    """How much the synthetic labels depend on the table-table dot products (benchmarks/synthetic_interactions.py)."""

    num_samples: int = flag(40000, "synthetic samples per seed")
    max_rows: int = flag(20000, "rows of the largest synthetic table")
    seeds: int = flag(3, "seeds 0 .. seeds - 1")

    def check(self) -> "InteractionsConfig":
        check_int("--num_samples", self.num_samples, 1000, 10_000_000)
        check_int("--max_rows", self.max_rows, 10, 100_000_000)
        check_int("--seeds", self.seeds, 1, 100)
        return self


def main(argv=None) -> None:
    parser = step_parser(InteractionsConfig, __doc__, raw_doc=True)
    a = config_from_args(InteractionsConfig, parser.parse_args(argv)).check()
    print("| seed | teacher AUC (ceiling) | without table-table dots | without any dots |\n|---|---:|---:|---:|")
    for seed in range(a.seeds):
        data = make_synthetic(a.num_samples, seed=seed, max_rows=a.max_rows)
        teacher, tables = synthetic_teacher(data.num_rows, data.dense.shape[1])
        T = len(tables)
        pairs = T * (T + 1) // 2
        full = teacher_logits(data, teacher, tables)
        # the mean of every dot product over the data (feature 0 is the bottom MLP's output)
        with torch.no_grad():
            x, sparse, _ = data.batch(torch.arange(data.num_samples))
            emb = torch.stack([torch.nn.functional.embedding_bag(i, w, o, mode="sum")
                               for (i, o), w in zip(sparse, tables)], dim=1)
            feats = torch.cat([teacher.bottom(x).unsqueeze(1), emb], dim=1)
            mean = torch.bmm(feats, feats.transpose(1, 2))[:, teacher.triu[0], teacher.triu[1]].mean(0)
        tt = teacher.triu[0] > 0
        no_tt = teacher_logits(data, teacher, tables, mean[tt])
        assert len(mean) == pairs
        no_dots = _without_dots(data, teacher, tables, mean)
        y = data.labels.numpy()
        print(f"| {seed} | {auc(full.numpy(), y):.4f} | {auc(no_tt.numpy(), y):.4f} | {auc(no_dots.numpy(), y):.4f} |")


@torch.no_grad()
def _without_dots(data, teacher, tables, mean) -> torch.Tensor:
    x, _, _ = data.batch(torch.arange(data.num_samples))
    z = teacher.bottom(x)
    return teacher.top(torch.cat([z, mean.expand(len(z), -1)], dim=1)).squeeze(-1)


if __name__ == "__main__":
    run_main(main)
