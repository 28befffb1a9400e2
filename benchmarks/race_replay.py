"""Racing replayed on a `real_tables.py --no_race` run's recorded rounds (every plan measured every round).

    python benchmarks/race_replay.py results/real_tables.json [more.json ...]

Per set it asks `StopRule.active` round by round on the recorded costs, as `--measure` would have, and
prints each plan racing drops (and the last round it would have been measured in), that plan's paired
ratio to the best over the whole run with its 95% interval, whether the best itself was dropped, and the
share of measuring time racing would have needed (round costs summed over the plans still measured,
against all). The same measurements both ways, so the comparison is paired.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from neuroshard.core.cli import run_main  # noqa: E402
from neuroshard.core.errors import UserError  # noqa: E402
from neuroshard.experiments.measure import MeasureConfig, StopRule, separation  # noqa: E402
from neuroshard.experiments.stats import paired  # noqa: E402


MAX_RESULT_BYTES = 64 << 20  # a real_tables.json of three sets is about 100 KB


def replay(names: list[str], costs: np.ndarray, min_rounds: int, max_rounds: int = MeasureConfig().max_rounds) -> dict:
    """[R, P] round costs of every plan -> the drops racing makes (`StopRule.active`) and the time share it needs."""
    R, P = costs.shape
    rule = StopRule(float("inf"), min_rounds, max_rounds, race=True)
    best = separation(costs)["best"]
    active = np.ones(P, bool)
    raced = costs.copy()
    drops = []
    for r in range(1, R + 1):
        raced[r - 1, ~active] = np.nan
        keep = rule.active(raced[:r])
        for i in np.flatnonzero(active & ~keep):
            st = paired(dict(enumerate(costs[:, i])), dict(enumerate(costs[:, best])))
            drops.append({"plan": names[i], "last_round": r, "ratio_to_best": st["ratio"], "ci_lo": st["ci_lo"],
                          "ci_hi": st["ci_hi"]})
        active = keep
    return {"rounds": R, "best": names[best], "drops": drops, "best_dropped": any(d["plan"] == names[best] for d in drops),
            "time_share": float(np.nansum(raced) / costs.sum())}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="real_tables.json of runs made with --no_race")
    a = p.parse_args(argv)
    for path in a.runs:
        f = Path(path)
        if not f.is_file() or f.stat().st_size > MAX_RESULT_BYTES:  # a device, a directory, something huge
            raise UserError(f"{path} is not a real_tables.json (not a regular file of at most "
                            f"{MAX_RESULT_BYTES >> 20} MiB); pass the results/real_tables.json of a --no_race run")
        try:
            rec = json.loads(f.read_text())
            parts = rec["per_rank_parts"]
            sets = list(dict.fromkeys(q["set"] for q in parts))
            if rec.get("config", {}).get("no_race") is not True:
                raise UserError(f"{path} was not measured with --no_race: racing can only be replayed on rounds "
                                "that measured every plan; run real_tables.py --no_race")
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise UserError(f"{path} is not a real_tables.json with round costs ({e}); run real_tables.py --no_race "
                            "from this version") from None
        for name in sets:
            rows = [q for q in parts if q["set"] == name]
            costs = np.array([q["round_ms"] for q in rows], np.float64).T
            if not np.isfinite(costs).all() or (costs <= 0).any():
                raise UserError(f"{path}: set {name} has missing or non-positive round costs; replay a --no_race run")
            out = replay([q["plan"] for q in rows], costs, MeasureConfig().min_rounds)
            print(f"{path} {name}: {out['rounds']} rounds, best over all rounds {out['best']}; best dropped: "
                  f"{'YES' if out['best_dropped'] else 'no'}; racing needs {out['time_share']:.0%} of the measuring time")
            for d in out["drops"]:
                print(f"  drops {d['plan']} after round {d['last_round']}: over all rounds {d['ratio_to_best']:.3f} "
                      f"[{d['ci_lo']:.3f}, {d['ci_hi']:.3f}] of the best")


if __name__ == "__main__":
    run_main(main)
