"""Step 4a: pre-train the compute cost model on collected compute-cost samples (DESIGN.md §3.3)."""
from __future__ import annotations

from pathlib import Path

from neuroshard.cli import ArgumentParser, run_main
from neuroshard.cost_models import train_compute_model
from neuroshard.dataset import DLRMDataset
from neuroshard.train_cli import add_training_args, training_kwargs


def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__)
    p.add_argument("--data_dir", default="data/cost_data", help="folder with compute_cost_data.pkl")
    p.add_argument("--dataset_dir", default="data/dlrm_datasets", help="processed dataset the samples came from")
    p.add_argument("--out_path", default="models/compute.pt")
    add_training_args(p, epochs=300)
    args = p.parse_args(argv)
    kw = training_kwargs(args)
    train_compute_model(Path(args.data_dir) / "compute_cost_data.pkl", DLRMDataset.load(args.dataset_dir),
                        args.out_path, args.epochs, args.num_samples, **kw)
    return 0


if __name__ == "__main__":
    run_main(main)
