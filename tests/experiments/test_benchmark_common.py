"""benchmarks/common.py, the helpers the benchmarks share: the machine's speed probe and the count of the pairs
of plans a measurement tells apart."""
import numpy as np
import torch

from conftest import load_script

common = load_script("benchmarks/common.py")
resolved_pairs, speed_probe_ms = common.resolved_pairs, common.speed_probe_ms


def test_resolved_pairs_count_only_the_pairs_the_rounds_tell_apart():
    """Rounds with a shared round-to-round drift: A is 20% cheaper than B in every round (told apart), C is A
    with +-3% alternating noise (not told apart from A, told apart from B). A prediction that swaps A and C
    loses nothing; one that puts B first loses both of B's pairs; a predicted tie agrees with no order."""
    drift = np.array([1.0, 1.3, 0.9, 1.1, 1.2, 0.8, 1.05, 0.95])
    rounds = {"A": 10 * drift, "B": 12.5 * drift, "C": 10 * drift * (1 + 0.03 * (-1) ** np.arange(8))}
    assert resolved_pairs(rounds, {"A": 1.0, "B": 2.0, "C": 1.1}) == (2, 2)
    assert resolved_pairs(rounds, {"A": 1.1, "B": 2.0, "C": 1.0}) == (2, 2)  # A and C: a tie the rounds cannot break
    assert resolved_pairs(rounds, {"A": 1.0, "B": 0.5, "C": 1.1}) == (2, 0)
    assert resolved_pairs(rounds, {"A": 1.0, "B": 1.0, "C": 1.0}) == (2, 0)
    assert resolved_pairs({"A": rounds["A"]}, {"A": 1.0}) == (0, 0)
    # several predictions at once: the pairs told apart once, then each prediction's count
    assert resolved_pairs(rounds, {"A": 1.0, "B": 2.0, "C": 1.1}, {"A": 1.0, "B": 0.5, "C": 1.1}) == (2, 2, 0)


def test_speed_probe_times_real_work_and_restores_the_thread_count():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        ms = speed_probe_ms(repeats=3)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert np.isfinite(ms) and ms > 0  # how fast is this machine's business, not the test's
