"""benchmarks/race_replay.py: racing replayed on recorded rounds drops the slow plan, never the best, and
refuses a run whose rounds did not measure every plan."""
import json
import sys

import numpy as np
import pytest

from conftest import ROOT
from neuroshard.core.errors import UserError

sys.path.insert(0, str(ROOT / "benchmarks"))
from race_replay import main, replay  # noqa: E402


def _rounds(R=12, seed=0):
    rng = np.random.default_rng(seed)
    base = rng.uniform(9, 11, R)[:, None]
    return base * np.array([1.0, 1.0, 2.0]) * rng.uniform(0.98, 1.02, (R, 3))


def test_replay_drops_the_slow_plan_after_min_rounds_and_counts_its_time():
    costs = _rounds()
    out = replay(["a", "b", "slow"], costs, min_rounds=5)
    assert [d["plan"] for d in out["drops"]] == ["slow"] and out["drops"][0]["last_round"] == 5
    assert not out["best_dropped"] and out["best"] in ("a", "b")
    assert out["drops"][0]["ci_lo"] > 1.0
    # time share by hand: every plan in rounds 1-5, then the two close ones
    want = (costs[:5].sum() + costs[5:, :2].sum()) / costs.sum()
    assert np.isclose(out["time_share"], want) and out["time_share"] < 0.8


def _run_file(tmp_path, costs, no_race=True):
    parts = [{"set": "s", "plan": n, "round_ms": [float(x) for x in costs[:, i]]} for i, n in enumerate("abc")]
    path = tmp_path / "real_tables.json"
    path.write_text(json.dumps({"config": {"no_race": no_race}, "per_rank_parts": parts}))
    return path


def test_the_script_reads_a_no_race_run_and_refuses_others(tmp_path, capsys):
    main([str(_run_file(tmp_path, _rounds()))])
    out = capsys.readouterr().out
    assert "best dropped: no" in out and "drops c after round 5" in out
    with pytest.raises(UserError, match="not measured with --no_race"):
        main([str(_run_file(tmp_path, _rounds(), no_race=False))])
    holes = _rounds()
    holes[7, 2] = np.nan  # a plan racing dropped: its later rounds are null
    with pytest.raises(UserError, match="missing or non-positive round costs"):
        main([str(_run_file(tmp_path, holes))])
    for other in ("/dev/zero", str(tmp_path)):  # an endless device, a directory: refused before reading
        with pytest.raises(UserError, match="not a regular file"):
            main([other])
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(UserError, match="is not a real_tables.json"):
        main([str(tmp_path / "bad.json")])
