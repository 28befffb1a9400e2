"""Rank functions for the engine-step tests on real gloo ranks (importable by spawned ranks)."""

import functools


def dmp_builds(rank, world, emit, dataset_dir, items, batch, rounds, every_values):
    """The engine's own rounds (`rounds_rank`, as `--measure` runs them) of a `DMPStep` that counts its real builds
    (TorchRec's DistributedModelParallel each time), once per `rebuild_every`; emits (rank, every, the index of
    each item built in build order, and on rank 0 each round's costs)."""
    from neuroshard.hardware.backends import resolve_hardware
    from neuroshard.hardware.dmp_step import DMPStep
    from neuroshard.hardware.engine import EngineSettings, FixedRounds, Job, rounds_rank

    builds = []

    class Counting(DMPStep):
        def _build(self, item):
            built = super()._build(item)
            builds.append(items.index(item))
            return built

    hw = resolve_hardware("cpu", "auto")
    for every in every_values:
        builds.clear()
        rounds_costs = []
        settings = EngineSettings(dataset_dir, hw, batch, 0, 1, step=Counting, rebuild_every=every)
        rounds_rank(rank, world, lambda msg: rounds_costs.append(msg[2].tolist()),
                    Job(settings, [list(items)], FixedRounds(rounds)))
        emit((rank, every, list(builds), rounds_costs))


def emulated_step_collectives(rank, world, emit, items, compute_ms, batch):
    """`EmulatedStep._step` of each item with this rank's compute ms, the real comm_bench collectives spied on
    (recorded, then called through): emits (rank, per item its result, and its calls in order: ("input",
    pooling), ("bw" | "fw", dim sums), ("all_gather" | "reduce_scatter", width), ("all_reduce", floats), ("delay",
    ms, the timed median), ("ready", the gathered values))."""
    from neuroshard.hardware import engine as comm_bench  # the collectives as the engine calls them
    from neuroshard.hardware.backends import resolve_hardware
    from neuroshard.hardware.engine import EmulatedStep, EngineSettings

    calls = []
    real_input, real_make, real_coll = comm_bench.InputDist, comm_bench.make_all_to_all, comm_bench.Collectives
    real_timed, real_gather = comm_bench.timed_collective, comm_bench.gather_floats

    class SpyInput(real_input):
        def __init__(self, pooling, batch_size, r, device):
            super().__init__(pooling, batch_size, r, device)
            self.pooling = pooling

    class SpyCollectives(real_coll):
        def __init__(self, width, batch_size, N, device, gradient_floats=None):
            super().__init__(width, batch_size, N, device, gradient_floats)
            self.width, self.floats = width, gradient_floats

    def make(dims, batch_size, r, device, keep=None):
        a2a = real_make(dims, batch_size, r, device, keep)
        a2a.dims = list(dims)
        return a2a

    def described(fn):
        obj = fn.__self__
        if isinstance(obj, SpyCollectives):
            return fn.__name__, obj.width
        return ("input", obj.pooling) if isinstance(obj, SpyInput) else \
            ({"forward": "fw", "backward": "bw"}[fn.__name__], obj.dims)

    def timed(fn, device, delay_ms, warmup, iters):
        if isinstance(fn, functools.partial):  # the replicas' all-reduce beside the other groups' backwards
            gradients, backwards = fn.args
            calls.append(("all_reduce beside", gradients.numel(), [described(b) for b in backwards]))
        else:
            calls.append(described(fn))
        ms = real_timed(fn, device, delay_ms, warmup, iters)
        calls.append(("delay", delay_ms, ms))
        return ms

    def gather(values, device):
        out = real_gather(values, device)
        calls.append(("gather", out))
        return out

    comm_bench.InputDist, comm_bench.make_all_to_all, comm_bench.Collectives = SpyInput, make, SpyCollectives
    comm_bench.timed_collective, comm_bench.gather_floats = timed, gather
    try:
        step = EmulatedStep(EngineSettings(None, resolve_hardware("cpu", "auto"), batch, 1, 2), rank, world)
        out = []
        for item in items:
            calls.clear()
            out.append((step._step(item, compute_ms[rank]), list(calls)))
    finally:
        comm_bench.InputDist, comm_bench.make_all_to_all, comm_bench.Collectives = real_input, real_make, real_coll
        comm_bench.timed_collective, comm_bench.gather_floats = real_timed, real_gather
    emit((rank, out))


def steps(rank, world, emit, dmp_args, emulated_args):
    """Both of the above on one pair of ranks (starting ranks that import TorchRec is most of their cost): emits
    ("dmp", message) and ("emulated", message)."""
    dmp_builds(rank, world, lambda m: emit(("dmp", m)), *dmp_args)
    emulated_step_collectives(rank, world, lambda m: emit(("emulated", m)), *emulated_args)
