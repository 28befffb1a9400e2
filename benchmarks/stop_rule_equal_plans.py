"""How often `--measure`'s stop rule calls two EQUAL plans told apart (a false "measured best").

    python benchmarks/stop_rule_equal_plans.py [--trials 300] [--max_rounds 30] [--noise 0.035] [--seed 0]

Simulated rounds: both plans share a per-round machine speed (uniform 5-7 ms) and each gets independent
log-normal noise of sd `--noise`. For equal plans and normal noise the rates do not depend on the sd
(both tests are scale-free); the real sets' top two plans measured per-round log ratios of sd 0.05-0.32,
heavier-tailed on Kaggle. The stop rule (`measure.separation`: the percentile bootstrap of the per-round ratio) and a paired
Student-t interval are asked at every round from 5 (`min_rounds`) to `--max_rounds`; printed: how often
each calls the plans separated at round 5, and at any look. A 95% interval should say so 5% of the time
at one look; more at round 5 means the interval is too narrow for 5 rounds, more over the looks is the
cost of looking after every round.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from neuroshard.core.cli import run_main  # noqa: E402
from neuroshard.core.errors import check_float, check_int  # noqa: E402
from neuroshard.experiments.measure import MeasureConfig, separation  # noqa: E402


def main(argv=None) -> None:
    from scipy.stats import t as student_t
    from tqdm import tqdm

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=300)
    p.add_argument("--max_rounds", type=int, default=30)
    p.add_argument("--noise", type=float, default=0.035, help="sd of each plan's log cost per round")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    first = MeasureConfig().min_rounds
    check_int("--trials", a.trials, 1, 1_000_000)
    check_int("--max_rounds", a.max_rounds, first, 10_000)
    check_float("--noise", a.noise, 0.0, 10.0, lo_open=True)
    rng = np.random.default_rng(a.seed)
    at_first = np.zeros(2)
    any_look = np.zeros(2)
    for _ in tqdm(range(a.trials), desc="trials"):
        costs = rng.uniform(5, 7, (a.max_rounds, 1)) * np.exp(rng.normal(0, a.noise, (a.max_rounds, 2)))
        seen = np.zeros(2, bool)
        for R in range(first, a.max_rounds + 1):
            d = np.log(costs[:R, 0] / costs[:R, 1])
            t_sep = abs(d.mean()) > student_t.ppf(0.975, R - 1) * d.std(ddof=1) / np.sqrt(R)
            now = np.array([separation(costs[:R])["separated"], t_sep])
            if R == first:
                at_first += now
            seen |= now
        any_look += seen
    print(f"two equal plans, {a.trials} trials, noise sd {a.noise:g}: called told apart at round {first}: "
          f"stop rule (bootstrap) {at_first[0] / a.trials:.1%}, t interval {at_first[1] / a.trials:.1%}; "
          f"at any round {first}-{a.max_rounds}: stop rule {any_look[0] / a.trials:.1%}, "
          f"t interval {any_look[1] / a.trials:.1%} (a 95% interval at one look: 5%)")


if __name__ == "__main__":
    run_main(main)
