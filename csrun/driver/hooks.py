"""Python the script hooked into the backward or the optimizer's step: what the device would leave out.

The device runs a step's backward and update itself, from the compiled program; hooks that
torch would call in the middle of them (a gradient hook on a weight, a module's backward hook,
an optimizer's step hooks) run Python the program does not hold. The driver refuses them at
the line of the ``backward()`` / ``optimizer.step()`` that would have called them.
"""

from __future__ import annotations

import torch
import torch.nn.modules.module as module_hooks
import torch.optim.optimizer as optimizer_hooks


def backward_hook_in(model: torch.nn.Module) -> str | None:
    """What hooks the model's backward (a description), or None."""
    for name, weight in model.named_parameters():
        if getattr(weight, "_backward_hooks", None) or getattr(weight, "_post_accumulate_grad_hooks", None):
            return f"a gradient hook on the weight {name!r} (Tensor.register_hook)"
    for name, module in model.named_modules():
        if module._backward_hooks or module._backward_pre_hooks:
            return f"a backward hook on the module {name or type(module).__name__!r}"
    if module_hooks._global_backward_hooks or module_hooks._global_backward_pre_hooks:
        return "a global module backward hook (register_module_full_backward_hook)"
    return None


def optimizer_hooks_on(optimizer: torch.optim.Optimizer) -> bool:
    """Whether step hooks would run around the optimizer's ``step()`` (its own or global ones)."""
    return bool(getattr(optimizer, "_optimizer_step_pre_hooks", None) or
                getattr(optimizer, "_optimizer_step_post_hooks", None) or
                optimizer_hooks._global_optimizer_pre_hooks or optimizer_hooks._global_optimizer_post_hooks)
