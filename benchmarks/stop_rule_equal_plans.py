"""How often `--measure`'s stop rule calls two EQUAL plans told apart (a false "measured best").

    python benchmarks/stop_rule_equal_plans.py [--trials 300] [--max_rounds 30] [--noise 0.035] [--seed 0]

Simulated rounds: both plans share a per-round machine speed (uniform 5-7 ms) and each gets independent
log-normal noise of sd `--noise`. For equal plans and normal noise the rates do not depend on the sd
(both tests are scale-free); the real sets' top two plans measured per-round log ratios of sd 0.05-0.32,
heavier-tailed on Kaggle. Three rules are asked, each from round 5 (`min_rounds`) to `--max_rounds`:
- a bootstrap 95% interval (`stats.paired`) after every round: the stop rule before alpha spending;
- a paired Student-t 95% interval after every round;
- the stop rule now (`measure.StopRule` / `look_alpha`): the t interval at the scheduled looks only, look k at
  1 - 0.05 / (k (k + 1)), and the verdict after the last round as one more look.
Printed: how often each calls the plans told apart at round 5, and at any look. A 95% interval should say so
5% of the time at one look; more at round 5 means the interval is too narrow for 5 rounds, more over the
looks is the cost of looking again and again, which the spending rule pays for.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from neuroshard.core.cli import run_main  # noqa: E402
from neuroshard.core.errors import check_float, check_int  # noqa: E402
from neuroshard.experiments.measure import MeasureConfig, look_alpha, separation  # noqa: E402
from neuroshard.experiments.stats import paired  # noqa: E402

def main(argv=None) -> None:
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
    rules = ("bootstrap 95% every round", "t 95% every round", "stop rule (t, alpha spending)")
    at_first = np.zeros(len(rules))
    any_look = np.zeros(len(rules))
    for _ in tqdm(range(a.trials), desc="trials"):
        costs = rng.uniform(5, 7, (a.max_rounds, 1)) * np.exp(rng.normal(0, a.noise, (a.max_rounds, 2)))
        seen = np.zeros(len(rules), bool)
        for R in range(first, a.max_rounds + 1):
            boot = paired(dict(enumerate(costs[:R, 0])), dict(enumerate(costs[:R, 1])))
            t95 = separation(costs[:R], 0.05)
            # either order: the rule is asked of whichever measured lower
            alpha = look_alpha(R, first, a.max_rounds, final=R == a.max_rounds)
            spent = alpha is not None and separation(costs[:R], alpha)["separated"]
            now = np.array([boot["ci_hi"] < 1 or boot["ci_lo"] > 1, t95["separated"], spent])
            if R == first:
                at_first += now
            seen |= now
        any_look += seen
    print(f"two equal plans, {a.trials} trials, noise sd {a.noise:g}; called told apart:")
    for name, f, n in zip(rules, at_first, any_look):
        print(f"  {name:<32} at round {first}: {f / a.trials:6.1%}   at any round {first}-{a.max_rounds}: "
              f"{n / a.trials:6.1%}")
    print("(a 95% interval at one look: 5%)")

if __name__ == "__main__":
    run_main(main)
