"""A stop rule for the racing test (spawned ranks import it by name): it stops only at max rounds and drops
plan `drop` after round `drop_after`, whatever the plans measured, so the test checks that every rank
measures exactly the plans rank 0 says (the drop decision itself is tested by hand in test_measure.py)."""
from dataclasses import dataclass

import numpy as np

from neuroshard.planning.stop_rule import StopRule


@dataclass
class ScriptedRace(StopRule):
    drop: int = 1
    drop_after: int = 4

    def __call__(self, round_costs, last_round_s: float) -> bool:
        return len(round_costs) >= self.max_rounds

    def active(self, round_costs):
        keep = np.isfinite(np.asarray(round_costs, np.float64)[-1, :self.num_candidates])
        if len(round_costs) >= self.drop_after:
            keep[self.drop] = False
        return keep
