"""Arguments shared by the two training scripts."""
from __future__ import annotations


def add_training_args(p, epochs: int) -> None:
    p.add_argument("--epochs", type=int, default=epochs)
    p.add_argument("--train_ratio", type=float, default=0.8)
    p.add_argument("--valid_ratio", type=float, default=0.1)
    p.add_argument("--batch_size", type=int, default=512)
    p.add_argument("--num_samples", type=int, default=None, help="use the first N samples (default all)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)


def training_kwargs(args) -> dict:
    from .errors import UserError

    if args.epochs < 1:
        raise UserError("--epochs must be >= 1")
    if not (0 < args.train_ratio < 1 and 0 < args.valid_ratio < 1 and args.train_ratio + args.valid_ratio < 1):
        raise UserError("--train_ratio and --valid_ratio must be in (0, 1) and sum to less than 1")
    return {"batch_size": args.batch_size, "lr": args.lr, "train_ratio": args.train_ratio,
            "valid_ratio": args.valid_ratio, "seed": args.seed}
