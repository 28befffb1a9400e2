"""The user's own TorchRec call, run in a forked process beside NeuroShard's search (`incumbent.TorchRecCall`): the
same plan as in this process, the same plan handed out by the planner either way, TorchRec's own error where the
child fails, the call made here where the child's reply does not read, and no process left behind by an error or a
Ctrl-C in the search."""
import os
import time

import numpy as np
import pytest

pytest.importorskip("torchrec")

from neuroshard.sharding.planner import incumbent  # noqa: E402
from neuroshard.sharding.planner.coverage import build, random_case  # noqa: E402
from neuroshard.sharding.planner.storage import default_reservation  # noqa: E402

from analytic_models import save_hand_models  # noqa: E402

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return save_hand_models(tmp_path_factory.mktemp("models4"), 4, {"batch_size": 128})


def cases(n: int, seed: int = 3):
    """n random cases on 4 ranks (cpu with row_wise offered, and cuda): (module, topology, constraints, sharders)."""
    rng = np.random.default_rng(seed)
    return [build(random_case(rng, 4, ("cpu", "cuda")[i % 2], row_wise_sharder=i % 2 == 0)) for i in range(n)]


def call_args(module, topology, constraints, sharders):
    return (topology, 32, constraints, default_reservation(), module, sharders)


def gone(pid: int) -> bool:
    """Whether no process of this pid is left (reaped, not a zombie), after up to 5 s."""
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_the_forked_call_returns_the_plan_made_here():
    planned = 0
    for module, topology, constraints, sharders in cases(4):
        args = call_args(module, topology, constraints, sharders)
        call = incumbent.TorchRecCall(args, 4, background=True)
        theirs, here = call.result(), incumbent.torchrec_full_plan(*args)
        assert call.ran_in_background
        assert (theirs is None) == (here is None)
        if here is not None:
            assert incumbent.parameter_specs(theirs) == incumbent.parameter_specs(here)
            planned += 1
    assert planned >= 3


def test_the_planner_hands_out_the_same_plan_with_the_call_beside_it_or_not(models, monkeypatch):
    from neuroshard import NeuroShardPlanner

    handed = []
    for module, topology, constraints, sharders in cases(3, seed=11):
        results = []
        for background in (True, False):
            monkeypatch.setattr(incumbent, "background_ok", lambda b=background: b)
            planner = NeuroShardPlanner(topology, batch_size=32, constraints=constraints, models_dir=models,
                                        debug=False)
            try:
                planner.plan(module, sharders)
            except Exception as e:  # a refusal: the same either way
                results.append(str(e))
                continue
            r = planner.last_result
            results.append((r.specs, r.chosen, r.torchrec_ms, r.notes))
        assert results[0] == results[1]
        handed.append(results[0])
    # a plan compared with TorchRec's, TorchRec's handed out (no plan of NeuroShard's fits), a refusal by both
    assert isinstance(handed[0], tuple) and handed[0][2] is not None
    assert isinstance(handed[1], tuple) and handed[1][1] == "torchrec"
    assert "TorchRec's EmbeddingShardingPlanner finds no plan either" in handed[2]


def test_a_failing_child_gives_torchrecs_own_error_here(monkeypatch):
    module, topology, constraints, sharders = cases(1)[0]
    calls = []

    def broken(*args):
        calls.append(os.getpid())
        raise RuntimeError("TorchRec failed on these tables")

    monkeypatch.setattr(incumbent, "torchrec_full_plan", broken)
    call = incumbent.TorchRecCall(call_args(module, topology, constraints, sharders), 4, background=True)
    with pytest.raises(RuntimeError, match="TorchRec failed on these tables"):
        call.result()
    assert not call.ran_in_background and calls == [os.getpid()]  # the child's call left no trace here


def test_a_reply_that_does_not_read_makes_the_call_here(monkeypatch):
    module, topology, constraints, sharders = cases(1)[0]
    args = call_args(module, topology, constraints, sharders)
    here = incumbent.torchrec_full_plan(*args)
    monkeypatch.setattr(incumbent, "parameter_specs", lambda plan, shapes=None: {"": {"tables": [{"name": 7}]}})
    call = incumbent.TorchRecCall(args, 4, background=True)
    theirs = call.result()
    monkeypatch.undo()
    assert not call.ran_in_background
    assert incumbent.parameter_specs(theirs) == incumbent.parameter_specs(here)


def test_close_and_ctrl_c_leave_no_child(models, monkeypatch):
    from neuroshard import NeuroShardPlanner

    module, topology, constraints, sharders = cases(1)[0]
    monkeypatch.setattr(incumbent, "torchrec_full_plan", lambda *args: time.sleep(60))
    call = incumbent.TorchRecCall(call_args(module, topology, constraints, sharders), 4, background=True)
    pid = call._pid
    assert pid is not None
    os.kill(pid, 0)  # still planning (asleep)
    call.close()
    assert gone(pid)

    started = []
    start = incumbent.TorchRecCall._start
    monkeypatch.setattr(incumbent.TorchRecCall, "_start", lambda self: (start(self), started.append(self._pid)))
    monkeypatch.setattr(incumbent, "background_ok", lambda: True)
    planner = NeuroShardPlanner(topology, batch_size=32, constraints=constraints, models_dir=models, debug=False)

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(planner.enumerator, "enumerate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        planner.plan(module, sharders)
    assert len(started) == 1 and started[0] is not None and gone(started[0])


def test_a_caller_that_reaps_its_children_itself_gets_the_call_here_and_a_forced_fork_still_works():
    """With SIGCHLD ignored, the kernel reaps children as they end, and a pid could be reused before it is
    signalled: no fork then. Forced, waitpid has none to wait for and the plan still comes back."""
    import signal

    module, topology, constraints, sharders = cases(1)[0]
    args = call_args(module, topology, constraints, sharders)
    assert incumbent.background_ok() == (len(os.sched_getaffinity(0)) >= 2)  # SIGCHLD at its default here
    before = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    try:
        assert not incumbent.background_ok()
        here = incumbent.TorchRecCall(args, 4)
        assert here._pid is None
        forced = incumbent.TorchRecCall(args, 4, background=True)
        theirs = forced.result()
        stopped = incumbent.TorchRecCall(args, 4, background=True)
        stopped.close()
    finally:
        signal.signal(signal.SIGCHLD, before)
    assert forced.ran_in_background and not here.ran_in_background
    assert incumbent.parameter_specs(theirs) == incumbent.parameter_specs(here.result())


def test_a_child_stuck_on_a_lock_is_stopped_and_the_call_made_here(monkeypatch):
    """A child that stops computing (here: waiting on an event no one sets, as on a lock another thread held at the
    fork) is killed after STALL_S without CPU progress, and the plan is made in this process."""
    import threading

    module, topology, constraints, sharders = cases(1)[0]
    args = call_args(module, topology, constraints, sharders)
    real, parent = incumbent.torchrec_full_plan, os.getpid()

    def stuck_in_the_child(*a):
        if os.getpid() != parent:
            threading.Event().wait()
        return real(*a)

    monkeypatch.setattr(incumbent, "torchrec_full_plan", stuck_in_the_child)
    monkeypatch.setattr(incumbent.TorchRecCall, "STALL_S", 1.0)
    call = incumbent.TorchRecCall(args, 4, background=True)
    pid = call._pid
    theirs = call.result()
    assert not call.ran_in_background and gone(pid)
    assert incumbent.parameter_specs(theirs) == incumbent.parameter_specs(real(*args))
