"""Rank functions for the DCT tests (importable by spawned ranks)."""
import torch


def topk_gradients(rank, world, emit, keep):
    """Rank r pools [B, W_r]; after the DCT-MP all-to-all and a loss on what arrived, only the k
    largest-magnitude entries per sample may have a gradient."""
    from neuroshard.training.dlrm import CommStats, pooled_all_to_all

    widths = [8, 12]
    g = torch.Generator().manual_seed(rank)
    pooled = torch.randn(6, widths[rank], generator=g).requires_grad_()
    stats = CommStats()
    recv = pooled_all_to_all(pooled, widths, stats, keep)
    (recv * torch.arange(1, recv.numel() + 1, dtype=recv.dtype)).sum().backward()
    emit((rank, pooled.detach(), pooled.grad, recv.detach(), stats.bytes["mp"]))
