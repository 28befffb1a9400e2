"""Adam with its second moment frozen after a warm-up (as 1-bit Adam does), for the MLPs under DCT-DP
(`--dp_adam_freeze_after`, `--dp_adam_floor`)."""
import torch


class FrozenAdam:
    """Adam with its second moment frozen, made from a `torch.optim.Adam` after some dense steps.

    Per parameter the bias-corrected second moment v is frozen, floored at `floor` times its mean over the
    parameter (without a floor a near-zero v of a rarely-moving entry blows the update up), and `step()` then
    keeps Adam's first moment and bias correction but divides by sqrt(v_frozen) + eps. The update is then linear
    in the gradients, so a residual DCT-DP delivers as one lump moves the weights as the small steps it stands for
    would have (momentum SGD with a fixed per-entry scale), instead of being cut to about the learning rate.
    Weight decay and amsgrad are not supported (the training loop uses neither). Parameters with no Adam state at
    the freeze are left alone.
    """

    def __init__(self, opt: torch.optim.Adam, floor: float = 0.1):
        self.opt, self.denom = opt, {}
        for group in opt.param_groups:
            if group.get("weight_decay") or group.get("amsgrad"):
                raise ValueError("FrozenAdam supports neither weight decay nor amsgrad")
            _, beta2 = group["betas"]
            for p in group["params"]:
                st = opt.state.get(p)
                if not st:
                    continue
                v = st["exp_avg_sq"] / (1 - beta2 ** float(st["step"]))
                self.denom[p] = v.clamp(min=floor * float(v.mean())).sqrt_().add_(group["eps"])

    @torch.no_grad()
    def step(self) -> None:
        for group in self.opt.param_groups:
            beta1, _ = group["betas"]
            for p in group["params"]:
                if p.grad is None or p not in self.denom:
                    continue
                st = self.opt.state[p]
                st["step"] += 1
                st["exp_avg"].mul_(beta1).add_(p.grad, alpha=1 - beta1)
                p.addcdiv_(st["exp_avg"], self.denom[p], value=-group["lr"] / (1 - beta1 ** float(st["step"])))
