"""Step 4a: pre-train the compute cost model on collected compute-cost samples (DESIGN.md §3.3)."""
from __future__ import annotations

from pathlib import Path

from neuroshard.core.cli import ArgumentParser, add_training_args, run_main, training_kwargs
from neuroshard.models.training import train_compute_model


def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__)
    p.add_argument("--data_dir", default="data/cost_data", help="folder with compute_cost_data.pkl")
    p.add_argument("--dataset_dir", default="data/dlrm_datasets", help="processed dataset the samples came from")
    p.add_argument("--out_path", default="models/compute.pt")
    add_training_args(p, epochs=300)
    a = p.parse_args(argv)
    train_compute_model(Path(a.data_dir) / "compute_cost_data.pkl", a.dataset_dir, a.out_path, **training_kwargs(a))
    return 0


if __name__ == "__main__":
    run_main(main)
