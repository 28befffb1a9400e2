"""`candidates.best_simulated`: the plan `--alg neuroshard` and `NeuroShardPlanner` hand out. The fastest rated,
unless TorchRec's plan is rated within `min_gain` of it; then TorchRec's (pure rule, no models)."""
import pytest

from neuroshard.core.config import check_min_gain
from neuroshard.core.errors import UserError
from neuroshard.sharding.candidates import Candidate, best_simulated, handout_verdict


def _cands(**ms):
    return [Candidate(name.split("__"), plan=None, simulated_ms=v) for name, v in ms.items()]


def test_torchrec_is_kept_unless_beaten_by_min_gain():
    cands = _cands(neuroshard=9.6, torchrec=10.0, size_greedy=11.0)
    assert best_simulated(cands).names == ["neuroshard"]  # min_gain 0: the fastest rated
    assert best_simulated(cands, 0.05).names == ["torchrec"]  # 4% cheaper: not enough
    assert best_simulated(cands, 0.04).names == ["neuroshard"]  # exactly 4% cheaper is enough for 4%
    assert best_simulated(_cands(torchrec=10.0, size_greedy=9.0), 0.05).names == ["size_greedy"]
    # TorchRec's plan rated fastest, or absent, or unpriced: the rule has nothing to keep
    assert best_simulated(_cands(neuroshard=10.5, torchrec=10.0), 0.05).names == ["torchrec"]
    assert best_simulated(_cands(neuroshard=9.9, size_greedy=10.0), 0.5).names == ["neuroshard"]
    assert best_simulated(_cands(neuroshard=9.9, torchrec=None), 0.5).names == ["neuroshard"]
    # a tie goes to NeuroShard's plan, also when it is TorchRec's plan under two names
    assert best_simulated(_cands(size_greedy=9.0, neuroshard=9.0, torchrec=10.0)).names == ["neuroshard"]
    assert best_simulated(_cands(neuroshard__torchrec=9.0, size_greedy=9.0), 0.05).names == ["neuroshard", "torchrec"]


def test_the_verdict_says_why():
    cands = _cands(neuroshard=9.6, torchrec=10.0)
    best = best_simulated(cands, 0.05)
    line = handout_verdict(best, sorted(cands, key=lambda c: c.simulated_ms), 0.05)
    assert line == "plan handed out: torchrec's; the fastest rated (neuroshard) is only 4.0% cheaper, less than --min_gain 0.05"
    assert handout_verdict(cands[0], cands, 0.0) == "plan handed out: NeuroShard's (neuroshard)"


@pytest.mark.parametrize("bad", [-0.01, 1.0, float("nan"), "x"])
def test_bad_min_gain_is_one_line(bad):
    with pytest.raises(UserError, match="--min_gain must be"):
        check_min_gain(bad)
