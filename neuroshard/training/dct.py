"""DCT-DP (DESIGN.md §5): a DDP communication hook that sends only gradient entries with |g| >= tau, and the
state it carries between iterations. The codec it sends with (the threshold, the selection, the wire format) is
`compression/dp_threshold.py`; this module decides when tau is re-estimated, keeps the residuals and runs the
collectives.

Per bucket and DDP iteration:
1. g = bucket / world_size (as PyTorch's default all-reduce hook divides before summing), plus, with
   error feedback, the residual each of the bucket's parameters carried from the last iteration;
2. tau is re-estimated on iterations 0, refresh, 2*refresh, ... (and the first time a bucket with a
   new set of parameters is seen) as the magnitude that keeps `keep` of the entries (the k-th largest
   |g|, k = max(1, floor(keep * n))); in between the stale tau is reused, so the count sent varies.
   Drift bound: when the stale tau would send more than `drift * k` entries, tau is re-estimated on
   the spot (the k-th largest |g| among the entries over the stale tau, which holds the k largest);
   if ties still leave more than floor(drift * k), only the k largest go out. So no rank ever sends
   more than max(k, floor(drift * k)) entries of a bucket;
3. the entries with |g| >= tau (zeros never) go out encoded (`dp_threshold.encode`: sorted indices as
   16-bit deltas and fp16 values, 4 bytes an entry). Every rank all_gathers the entry counts (one
   int32), then its payload padded to the largest count, and sums what all ranks sent into a dense
   tensor of the bucket's shape (the hook must return one). Should the padded payload be no smaller
   than the bucket itself, the bucket goes out dense (all_reduce) instead; `keep >= 1` always does,
   exactly as `dense_hook`;
4. with error feedback, what was not delivered (g minus the fp16 value that went out) is kept as the
   residual of the bucket's parameters.

Asynchronous by default, in the shape of PyTorch's PowerSGD hook: the hook does steps 1-3's local
work (thresholding, encoding) on the training thread, starts the count all_gather with
`async_op=True` and returns at once a future that completes later, so DDP's backward goes on
computing the next buckets' gradients while this one travels. When the counts arrive (a callback on
the communication thread) the payload all_gather (or the dense all_reduce) is launched, and a last
callback decodes it into the bucket. Collectives must be issued in the same order on every rank;
callbacks run on gloo's worker threads in whatever order they finish, so the payloads go through a
process group of their own and are launched strictly in the order the hook was called (a sequence
number per call; a bucket whose counts arrive early waits for its predecessors' launches, never
for their data). Nothing blocks inside a callback. `DCTState(sync=True)` runs the same arithmetic
with blocking collectives on the default group and returns a completed future: gradients are
identical bit for bit (tested), so it serves as the reference, and as the fallback where a backend's
futures cannot run Python callbacks.

State survives DDP's bucket rebuild (after the first iteration DDP regroups parameters into new
buckets; PyTorch's PowerSGD hook guards against it by compressing only from its second iteration
and keying its state by bucket index). Here per-bucket state is keyed by the bucket's parameters,
never by bucket index: a bucket with a new set of parameters gets its own threshold (refreshed on the
spot, reason "new bucket"); a bucket with a new layout (a new set, or the same parameters in another
order, which a rebuild also makes) gets its own buffers, and its residual is assembled from the
residuals its parameters carried in their old buckets, so a rebuild neither mixes nor loses them.
Iterations are counted by the hook itself (on each iteration's last bucket).

Choices the source leaves open, each a flag: the statistic (top-k magnitude), the refresh interval
(`--dp_refresh`), the drift bound (`--dp_drift`), error feedback (`--error_feedback on|off`),
asynchronous or blocking collectives (`--dp_sync`); the encoding (delta-16 indices, fp16 values) is
this project's. Bytes are counted from the tensors handed to the collectives; the dense baseline
(`dense_hook`) does what DDP's default hook does (an asynchronous all_reduce) and counts its
all_reduce the same way.

On CPU, between refreshes, steps 1 and 2's share and threshold scan run as one fused pass in C, and
step 3's encoding and decoding as others (`compression/dp_threshold_native.py`: the same floats, positions and
bytes, compiled at first use, letting go of Python's lock while they run; the PyTorch path where no C compiler
is found). With error feedback, g is written over the residual it adds (entry by entry), so the pass
streams two bucket-sized buffers, not three.

Time accounting (`HookState`): `codec_s` is the compression work done on the training thread this
step (thresholding, tau refreshes, encoding; with `sync=True` also the residual update and
decoding); `work` adds up every stage's seconds on whichever thread ran it, for profiling (the fused
pass counts as "select");
`compute_done_at` is when autograd finished computing gradients in the last iteration (an autograd
callback queued by the iteration's last bucket, run before DDP waits for the futures), so the
trainer can tell the time the step waited for DP communication afterwards.
"""

import threading
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..compression import dp_threshold_native
from ..compression.dp_threshold import (add_mean_share, decode_into, drift_cap, encode, keep_count, kth_largest,
                                        over_threshold, payload_bytes)
from ..compression.wire import MIN_POSITIVE
from ..core.config import DP_DRIFT, DP_ERROR_FEEDBACK, DP_KEEP, DP_REFRESH
from .dlrm import CommStats, nbytes

STAGES = ("prepare", "threshold", "select", "encode", "residual", "decode")  # compression work, in order


def _done(t: torch.Tensor) -> torch.futures.Future:
    fut = torch.futures.Future()
    fut.set_result(t)
    return fut


@dataclass(kw_only=True)
class HookState:
    """What every DP hook of this module records (see the module docstring, "Time accounting").

    stats: bytes handed to the collectives (and, with sync=True, seconds spent in them).
    sync: blocking collectives and a completed future (True), or asynchronous ones whose future
        completes while backward goes on (False, the default, as DDP's own hook).
    """

    stats: CommStats = field(default_factory=CommStats)
    sync: bool = False
    codec_s: float = 0.0                             # training-thread compression work this step
    work: dict = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))  # all threads, cumulative
    compute_done_at: float | None = None             # perf_counter when autograd's last gradient was ready

    def __post_init__(self):
        self._lock = threading.RLock()

    def add_bytes(self, n: int, seconds: float = 0.0) -> None:
        with self._lock:  # callbacks add from gloo's threads
            self.stats.add("dp", n, seconds)

    def timed(self, stage: str, t0: float, on_training_thread: bool) -> float:
        """Charge the seconds since t0 to `stage`; returns now."""
        now = time.perf_counter()
        with self._lock:
            self.work[stage] += now - t0
            if on_training_thread:
                self.codec_s += now - t0
        return now

    def step_reset(self) -> None:
        self.codec_s, self.compute_done_at = 0.0, None

    def mark_compute_done(self) -> None:
        """Called on an iteration's last bucket: note when autograd ends (before DDP's wait)."""
        def note():
            self.compute_done_at = time.perf_counter()

        try:
            torch.autograd.Variable._execution_engine.queue_callback(note)
        except RuntimeError:  # not inside a backward pass (a hook called by hand): nothing to time
            pass


def dense_hook(state, bucket) -> torch.futures.Future[torch.Tensor]:
    """The uncompressed baseline: divide by the world size, all_reduce (as DDP's default hook).
    `state` is a `HookState`, or a bare `CommStats` (then it runs blocking)."""
    if isinstance(state, CommStats):
        state = HookState(stats=state, sync=True)
    if bucket.is_last():
        state.mark_compute_done()
    t = bucket.buffer()
    t.div_(dist.get_world_size())
    return _all_reduce(state, t, None, lambda r: r)


def _all_reduce(state: HookState, t: torch.Tensor, group, then) -> torch.futures.Future:
    """all_reduce `t` (blocking with sync, else asynchronous on `group`), then `then(t)`."""
    if state.sync:
        t0 = time.perf_counter()
        dist.all_reduce(t)
        state.add_bytes(nbytes(t), time.perf_counter() - t0)
        return _done(then(t))
    state.add_bytes(nbytes(t))

    def arrived(fut):
        fut.value()  # raises the collective's error, if any
        return then(t)
    return dist.all_reduce(t, group=group, async_op=True).get_future().then(arrived)


@dataclass(kw_only=True)
class DCTState(HookState):
    """DCT-DP's hyperparameters and the state it carries between iterations.

    keep: target share of a bucket's entries sent (k = max(1, floor(keep * n))); >= 1 sends every
        entry with the dense all_reduce, bit for bit as `dense_hook`.
    refresh: iterations between scheduled threshold re-estimates (the k-th largest |g|).
    error_feedback: carry what was not delivered to the next iteration, per parameter.
    drift: re-estimate tau early once the stale tau would send more than drift * k entries of a
        bucket; no rank ever sends more than max(k, floor(drift * k)).
    stats, sync: as `HookState` (sync=False: asynchronous collectives, the default).
    dense_until: iterations sent with the dense all_reduce before compression starts (a warm-up, as
        `--dp_adam_freeze_after` uses it: Adam's second moment is estimated from dense gradients).
    payload_group: the process group the asynchronous hook launches payloads on (made on first use,
        from every rank, when None); the counts go on the default group.
    The rest is state: iterations completed, thresholds per bucket (keyed by its parameters),
    residuals per parameter, and logs of refreshes (iteration, bucket index, reason) and of what
    each bucket sent (iteration, bucket index, n, k, entries sent).
    """

    keep: float = DP_KEEP
    refresh: int = DP_REFRESH
    error_feedback: bool = DP_ERROR_FEEDBACK
    drift: float = DP_DRIFT
    dense_until: int = 0
    payload_group: object = None
    iteration: int = 0                                # DDP iterations completed
    tau: dict = field(default_factory=dict)           # frozenset of parameter ids -> threshold
    residual: dict = field(default_factory=dict)      # parameter id -> carried residual (its shape, flat)
    refreshed_at: list = field(default_factory=list)  # (iteration, bucket index, reason)
    sent: list = field(default_factory=list)          # (iteration, bucket index, n, k, entries sent)

    def __post_init__(self):
        super().__post_init__()
        self._buffers: dict = {}  # the bucket's parameter ids, in its order -> _Buffers
        self._calls = 0           # hook calls that go through the payload sequence
        self._next_launch = 0     # the call whose payload is launched next
        self._waiting: dict = {}  # call number -> its launch, once its counts are in


class _Buffers:
    """A bucket's reusable work tensors (allocating 2M floats afresh costs more than using them). With a carried
    residual, g is written over it (res + bucket / world, entry by entry): the pass streams two buffers instead of
    three, and what was not delivered is then already in place as the next residual. `g` is the buffer for an
    iteration with no residual (the first, or one after a dense exchange), made when one needs it."""

    def __init__(self, n: int):
        self.n = n
        self.g: torch.Tensor | None = None
        self.res: torch.Tensor | None = None  # the carried residual (None: nothing carried)

    def target(self, res: torch.Tensor | None) -> torch.Tensor:
        """Where this iteration's g goes: over the residual `res` it adds, else the bucket's own g buffer."""
        if res is not None:
            return res
        if self.g is None:
            self.g = torch.empty(self.n)
        return self.g


class _Bucket:
    """One hook call's local work: the bucket's g, what goes out, and how to finish."""

    def __init__(self, state: DCTState, bucket, world: int):
        t0 = time.perf_counter()
        self.state, self.world = state, world
        self.buf = buf = bucket.buffer()
        self.params = params = bucket.parameters()
        self.sizes = [p.numel() for p in params]
        self.n, self.b, self.it = buf.numel(), bucket.index(), state.iteration
        order = tuple(id(p) for p in params)  # buffers follow the bucket's layout: its parameters in order
        key = frozenset(order)                # the threshold follows its entries, whatever their order
        w = state._buffers.get(order)
        if w is None:
            w = self._new_buffers(order)
        res = w.res if state.error_feedback else None
        self.w, self.g = w, (g := w.target(res))
        self.k = k = keep_count(self.n, state.keep)
        cap = drift_cap(k, state.drift)
        scheduled = self.it % state.refresh == 0
        refresh = scheduled or key not in state.tau
        idx = None
        if not refresh:  # the stale tau: share and scan fused in one pass where that can run
            idx = dp_threshold_native.share_select(buf, res, world, max(state.tau[key], MIN_POSITIVE), g, 8 * cap)
        if idx is None:
            if res is not None:
                add_mean_share(res, buf, world, out=g)  # g is res: entry by entry, in place
            else:
                torch.div(buf, world, out=g)
            t0 = state.timed("prepare", t0, True)
            if refresh:
                state.tau[key] = kth_largest(g, k)
                state.refreshed_at.append((self.it, self.b, "scheduled" if scheduled else "new bucket"))
                t0 = state.timed("threshold", t0, True)
            idx = over_threshold(g, max(state.tau[key], MIN_POSITIVE))  # zeros never go out
        if idx.numel() > cap:  # the stale tau drifted: re-estimate now, exactly and cheaply, since the
            cand = g[idx].abs()  # k largest entries are all among these candidates
            top = cand.topk(k, sorted=False)
            state.tau[key] = float(top.values.min())
            state.refreshed_at.append((self.it, self.b, "drift"))
            keep_idx = torch.nonzero(cand >= state.tau[key]).squeeze(1)
            if keep_idx.numel() > cap:  # ties at tau: only the k largest
                keep_idx = torch.sort(top.indices).values
            idx = idx[keep_idx]
        self.idx = idx
        t0 = state.timed("select", t0, True)
        coded = dp_threshold_native.encode(idx, g)  # in C where it can run (the same bytes)
        self.deltas, self.vals, self.real = coded if coded is not None else encode(idx, g[idx])
        state.sent.append((self.it, self.b, self.n, k, idx.numel()))
        self.count = torch.tensor([self.deltas.numel()], dtype=torch.int32)
        state.timed("encode", t0, True)

    def _new_buffers(self, order: tuple) -> _Buffers:
        """Buffers for a bucket with a new layout (DDP's first buckets, or its rebuild, which may also
        reorder the parameters of a bucket it keeps): the residual is what its parameters carried in
        their old buckets, whose buffers go."""
        state = self.state
        mine = set(order)
        for old in [k for k in state._buffers if mine.intersection(k)]:
            del state._buffers[old]
        w = state._buffers[order] = _Buffers(self.n)
        carried = [state.residual.get(id(p)) for p in self.params]
        if state.error_feedback and any(r is not None for r in carried):
            w.res = torch.cat([r if r is not None else torch.zeros(s) for r, s in zip(carried, self.sizes)])
        return w

    # --------------------------------------------------------------- after the counts: one of three ends
    def route(self, m: int) -> str:
        """dense: the padded payload is no smaller than the bucket; none: no rank has an entry over
        tau; payload: the encoded entries."""
        return "dense" if 4 * m >= 4 * self.n else "none" if m == 0 else "payload"

    def keep_residual(self, delivered: bool) -> None:
        """With error feedback, g minus what was delivered becomes the residual (g's buffer is
        kept, not copied); after a dense exchange nothing is carried."""
        state, w = self.state, self.w
        if not state.error_feedback:
            return
        if not delivered:  # the dense all_reduce delivered all of g (the exchange's buffer is g, not w.res)
            w.res = None
            for p in self.params:
                state.residual.pop(id(p), None)
            return
        if self.idx.numel():
            self.g[self.idx] -= self.vals[self.real].float()  # what arrives is the fp16 value: the rest stays
        if w.res is not self.g:  # g was the g buffer (no residual carried): it becomes the residual
            w.res, w.g = self.g, None
        for p, piece in zip(self.params, torch.split(w.res, self.sizes)):
            state.residual[id(p)] = piece

    def payload(self, m: int) -> torch.Tensor:
        t0 = time.perf_counter()
        p = payload_bytes(self.deltas, self.vals, m)
        self.state.timed("encode", t0, self.state.sync)
        return p

    def decode(self, gathered: list[torch.Tensor], m: int) -> torch.Tensor:
        t0 = time.perf_counter()
        if not dp_threshold_native.decode(self.buf, gathered, m):  # in C where it can run (the same floats)
            self.buf.zero_()
            for part in gathered:
                decode_into(self.buf, part, m)
        self.state.timed("decode", t0, self.state.sync)
        return self.buf

    def residual_timed(self, delivered: bool) -> None:
        t0 = time.perf_counter()
        self.keep_residual(delivered)
        self.state.timed("residual", t0, self.state.sync)


def dct_hook(state: DCTState, bucket) -> torch.futures.Future[torch.Tensor]:
    last = bucket.is_last()
    if last:
        state.mark_compute_done()
    if state.keep >= 1 or state.iteration < state.dense_until:  # the dense all_reduce, bit for bit
        buf = bucket.buffer()
        buf.div_(dist.get_world_size())
        fut = _all_reduce(state, buf, None, lambda t: t)
    else:
        work = _Bucket(state, bucket, dist.get_world_size())
        fut = _exchange_sync(work) if state.sync else _exchange_async(work)
    if last:
        state.iteration += 1
    return fut


def _exchange_sync(work: _Bucket) -> torch.futures.Future:
    """Blocking collectives on the default group; the reference for the asynchronous exchange."""
    state, world = work.state, work.world
    t0 = time.perf_counter()
    counts = [torch.empty_like(work.count) for _ in range(world)]
    dist.all_gather(counts, work.count)
    m = int(torch.stack(counts).max())
    seconds = time.perf_counter() - t0
    route = work.route(m)
    if route == "dense":
        state.add_bytes(nbytes(work.count), seconds)
        work.residual_timed(False)
        return _all_reduce(state, work.g, None, lambda g: work.buf.copy_(g))
    if route == "none":  # nothing was delivered, so all of g waits for a later iteration
        state.add_bytes(nbytes(work.count), seconds)
        work.residual_timed(True)
        work.buf.zero_()
        return _done(work.buf)
    payload = work.payload(m)
    gathered = [torch.empty_like(payload) for _ in range(world)]
    t0 = time.perf_counter()
    dist.all_gather(gathered, payload)
    state.add_bytes(nbytes(work.count, payload), seconds + time.perf_counter() - t0)
    work.residual_timed(True)
    return _done(work.decode(gathered, m))


def _exchange_async(work: _Bucket) -> torch.futures.Future:
    """Counts now (default group), the payload once every rank's count is in (payload group, in
    call order), the decode when it arrives; returns the future of the decoded bucket."""
    state, world = work.state, work.world
    if state.payload_group is None:  # every rank's first hook call: the same point everywhere
        state.payload_group = dist.new_group(backend=dist.get_backend())
    out: torch.futures.Future = torch.futures.Future()
    seq = state._calls
    state._calls += 1
    counts = [torch.empty_like(work.count) for _ in range(world)]
    state.add_bytes(nbytes(work.count))

    def counts_in(fut):
        try:
            fut.value()  # raises the count all_gather's error (a lost peer), if any
            m = int(torch.stack(counts).max())
            launch = _launcher(work, m, out)
        except BaseException as e:  # noqa: BLE001 -- the future carries it to DDP
            launch = _failer(out, e)
        _launch_in_order(state, seq, launch, out)

    dist.all_gather(counts, work.count, async_op=True).get_future().then(counts_in)
    return out


def _failer(out: torch.futures.Future, e: BaseException):
    def fail():
        if not out.done():
            out.set_exception(e)
    return fail


def _launcher(work: _Bucket, m: int, out: torch.futures.Future):
    """The local part of the bucket's second exchange is done here (residual, payload); the returned
    function only launches its collective (or completes `out` when there is none)."""
    state, group = work.state, work.state.payload_group

    def finish(fut, result):
        try:
            fut.value()  # raises the collective's error, if any
            out.set_result(result())
        except BaseException as e:  # noqa: BLE001
            out.set_exception(e)

    route = work.route(m)
    if route == "dense":
        work.residual_timed(False)
        g = work.g

        def launch():
            state.add_bytes(nbytes(g))
            dist.all_reduce(g, group=group, async_op=True).get_future().then(
                lambda f: finish(f, lambda: work.buf.copy_(g)))
        return launch
    if route == "none":
        work.residual_timed(True)

        def launch():
            out.set_result(work.buf.zero_())
        return launch
    payload = work.payload(m)
    gathered = [torch.empty_like(payload) for _ in range(work.world)]
    work.residual_timed(True)

    def launch():
        state.add_bytes(nbytes(payload))
        dist.all_gather(gathered, payload, group=group, async_op=True).get_future().then(
            lambda f: finish(f, lambda: work.decode(gathered, m)))
    return launch


def _launch_in_order(state: DCTState, seq: int, launch, out: torch.futures.Future) -> None:
    """Run `launch` of call `seq` once every earlier call's has run: collectives go out in the
    same order on every rank, whichever thread's counts arrive first."""
    with state._lock:
        state._waiting[seq] = (launch, out)
        while state._next_launch in state._waiting:
            go, fut = state._waiting.pop(state._next_launch)
            state._next_launch += 1
            try:
                go()
            except BaseException as e:  # noqa: BLE001 -- a launch that fails fails its own future only
                if not fut.done():
                    fut.set_exception(e)
