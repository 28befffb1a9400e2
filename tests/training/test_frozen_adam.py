"""FrozenAdam (training/frozen_adam.py), the optimizer of --dp_adam_freeze_after."""
import pytest
import torch

from neuroshard.training.frozen_adam import FrozenAdam


def test_frozen_adam_divides_by_the_floored_second_moment_of_the_warm_up():
    """--dp_adam_freeze_after: after dense Adam steps, FrozenAdam keeps Adam's first moment and bias
    correction but divides by the frozen bias-corrected second moment, floored at floor x its mean."""
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(50))
    opt = torch.optim.Adam([p], lr=0.01)
    for _ in range(3):
        p.grad = torch.randn(50) * torch.linspace(0.001, 1, 50)
        opt.step()
    st = opt.state[p]
    v = st["exp_avg_sq"] / (1 - 0.999 ** 3)
    frozen = v.clamp(min=0.1 * float(v.mean()))
    assert (frozen > v).any()  # the floor binds for the small entries
    fa = FrozenAdam(opt, floor=0.1)
    m, w = st["exp_avg"].clone(), p.detach().clone()
    g = torch.randn(50)
    p.grad = g.clone()
    fa.step()
    m = 0.9 * m + 0.1 * g
    want = w - 0.01 / (1 - 0.9 ** 4) * m / (frozen.sqrt() + 1e-8)
    assert torch.allclose(p.detach(), want, rtol=1e-5, atol=1e-7)
    assert float(st["step"]) == 4 and torch.equal(st["exp_avg_sq"] / (1 - 0.999 ** 3), v)  # v untouched
    with pytest.raises(ValueError, match="weight decay"):
        FrozenAdam(torch.optim.Adam([p], weight_decay=0.1))
