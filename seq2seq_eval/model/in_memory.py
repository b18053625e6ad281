"""A model object handed to evaluate() by a running job: the module that generates (unwrapped
from the job's wrappers), and generation run without changing what the job sees afterwards."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ..errors import ConfigError


def unwrap(model: Any) -> Any:
    """The module that generates: DistributedDataParallel's (and DataParallel's, torch.compile's)
    inner module, whose generate() runs no collective, so ranks may run different numbers of
    batches. FSDP shards the weights: its forward gathers them with collectives every rank must
    join, which uneven batches would deadlock."""
    import torch

    while True:
        if isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
            model = model.module
        elif hasattr(model, "_orig_mod") and type(model).__name__ == "OptimizedModule":
            model = model._orig_mod
        else:
            break
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(f"evaluate(): model must be a torch module or a path, got {type(model).__name__}")
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch built without distributed
        return model
    if isinstance(model, FullyShardedDataParallel) or any(isinstance(p, DTensor) for p in model.parameters()):
        raise ConfigError(
            "evaluate(): the model is sharded by FSDP; generation would gather its weights with collectives "
            "every rank must join, which uneven batches deadlock. Save a checkpoint (full state dict) and pass "
            "its path, or pass an unsharded copy of the model"
        )
    return model


@contextlib.contextmanager
def untouched(model: Any) -> Iterator[None]:
    """Run generation inside a training job without changing what the job sees afterwards.

    The engine seeds torch per batch (batch k: seed + k, so sampled text does not depend on the
    world size); fork_rng puts the job's CPU and CUDA random states back, so its next dropout
    mask and shuffle are those of a job that never evaluated. The engine also replaces the
    model's generation_config with the run's settings, and generation needs eval mode (no
    dropout): both are restored, per submodule, as are the requires_grad flags."""
    import torch

    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=cuda):
        if model is None:  # a model loaded from a path: only the random state is the job's
            yield
            return
        modes = [(m, m.training) for m in model.modules()]
        flags = [(p, p.requires_grad) for p in model.parameters()]
        own_config = getattr(model, "generation_config", None)
        model.eval()
        try:
            with torch.no_grad():
                yield
        finally:
            for m, training in modes:
                m.training = training
            for p, requires_grad in flags:
                p.requires_grad_(requires_grad)
            if own_config is not None:
                model.generation_config = own_config
