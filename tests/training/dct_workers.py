"""Rank functions for the DCT tests (importable by spawned ranks)."""
import torch


def topk_gradients(rank, world, emit, keeps):
    """For each keep: rank r pools [B, W_r]; after the DCT-MP all-to-all and a loss on what arrived, only
    the k largest-magnitude entries per sample may have a gradient (keep "sign": scope sign)."""
    from neuroshard.training.dlrm import CommStats, pooled_all_to_all

    for keep in keeps:  # a keep of "sign" or "sign2": that scope over the column shards `segments`
        # sign2 gives 2 bits forward only to shards from 88 columns: rank 0 holds one such shard and a narrow one
        widths, segments = ([104, 128], [[96, 8], [128]]) if keep == "sign2" else ([8, 12], [[5, 3], [12]])
        g = torch.Generator().manual_seed(rank)
        pooled = torch.randn(6, widths[rank], generator=g).requires_grad_()
        stats = CommStats()
        if keep in ("sign", "sign2"):
            recv = pooled_all_to_all(pooled, widths, stats, 0.05, segments, keep)
        else:
            recv = pooled_all_to_all(pooled, widths, stats, keep)
        (recv * torch.arange(1, recv.numel() + 1, dtype=recv.dtype)).sum().backward()
        # plain arrays through the pipe (tensors would travel as shared-memory handles a finished rank closes)
        emit((keep, rank, pooled.detach().numpy(), pooled.grad.numpy(), recv.detach().numpy(), stats.bytes["mp"]))


def multi_bucket(rank, world, emit, configs):
    """For each config (error_feedback, static_graph, as_view, keep, growth, drift, refresh[, sync[, cap_mb]]):
    a 1.8M-parameter MLP under DDP with cap_mb (default 1) MB buckets and the DCT-DP hook (asynchronous unless sync), 4
    iterations without an optimizer step (so the weights stay fixed), the loss scaled by growth **
    iteration. Emits the gradients DDP delivered and the true average of the ranks' local gradients
    (both summed over the iterations), the residuals left (summed over ranks), what each bucket sent,
    the refreshes, and a digest of each iteration's delivered gradients (all parameters' bytes)."""
    import hashlib

    import copy

    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from neuroshard.training.dct import DCTState, dct_hook

    for c, (error_feedback, static_graph, as_view, keep, growth, drift, refresh, *rest) in enumerate(configs):
        sync = rest[0] if rest else False
        cap_mb = rest[1] if len(rest) > 1 else 1
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 256),
                            nn.ReLU(), nn.Linear(256, 1))
        plain = copy.deepcopy(net)
        model = DDP(net, bucket_cap_mb=cap_mb, static_graph=static_graph, gradient_as_bucket_view=as_view)
        state = DCTState(keep=keep, refresh=refresh, error_feedback=error_feedback, drift=drift, sync=sync)
        model.register_comm_hook(state, dct_hook)
        delivered = [torch.zeros_like(p) for p in net.parameters()]
        true = [torch.zeros_like(p) for p in net.parameters()]
        g = torch.Generator().manual_seed(100 + rank)
        digests = []
        for it in range(4):
            x = torch.randn(32, 512, generator=g)
            model.zero_grad()
            (model(x).pow(2).mean() * growth ** it).backward()
            plain.zero_grad()
            (plain(x).pow(2).mean() * growth ** it).backward()
            digests.append(hashlib.sha256(b"".join(p.grad.numpy().tobytes() for p in net.parameters())).hexdigest())
            for d, t, p, q in zip(delivered, true, net.parameters(), plain.parameters()):
                d += p.grad
                local = q.grad.clone()
                dist.all_reduce(local)
                t += local / world
        residual = [state.residual.get(id(p), torch.zeros(p.numel())).reshape(p.shape).clone()
                    for p in net.parameters()]
        for r in residual:
            dist.all_reduce(r)
        arrays = [[t.numpy() for t in ts] for ts in (delivered, true, residual)]  # plain arrays through the pipe
        emit((c, rank, *arrays, state.sent, state.refreshed_at, digests))
