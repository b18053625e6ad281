"""Generation engines: `--engine hf` (model.generate(), the default) and `--engine ctranslate2`.

An engine is one file here with a class satisfying `base.Engine` and a line in `ENGINES` below.
The run asks this module three things, in order: what identifies the engine's results (`describe`,
before any work: it goes into the manifest, so a resume under another engine is refused), whether
the run's generation settings are ones it can honour (`check`, before any work: a setting it
cannot honour is an error naming it, never dropped), and the engine itself (`load`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from ..config import EvalConfig
from ..model.kind import CAUSAL, SEQ2SEQ
from .base import BatchOutput, Engine

ENGINES = ("hf", "ctranslate2")

__all__ = ["ENGINES", "BatchOutput", "Engine", "check", "describe", "load"]


def describe(cfg: EvalConfig) -> dict[str, Any]:
    if cfg.engine == "ctranslate2":
        from . import ct2

        return ct2.describe(cfg)
    return {"name": "hf"}


def check(cfg: EvalConfig, model_config: Any, generation_config: Any, tokenizer: Any,
          device_type: str = "cpu", kind: str = SEQ2SEQ) -> None:
    """Raise ConfigError for a setting the engine cannot honour (its table in rules.py or
    ct2_rules.py, for the model's kind: model/kind.py), or a compute type the device cannot run;
    cheap (no model is loaded or converted)."""
    if cfg.engine == "ctranslate2":
        from . import ct2

        ct2.check(cfg, model_config, generation_config, tokenizer, device_type, causal=kind == CAUSAL)
        from ..model.converted import is_converted_folder

        if is_converted_folder(cfg.model_name):  # a folder to convert is checked once converted (load)
            _ct2_class(kind).check_folder(Path(os.path.expanduser(cfg.model_name)), tokenizer)
        return
    from .rules import HF_RULES, check as check_rules

    check_rules("hf", HF_RULES, cfg.gen_kwargs, generation_config, model_config,
                lambda key: "remove it")


def load(cfg: EvalConfig, *, tokenizer: Any, model_config: Any, generation_config: Any, device: Any,
         env: Any, model: Any = None, kind: str = SEQ2SEQ) -> Engine:
    """This rank's engine. `model`: an already loaded PyTorch model for the HF engine (else it is
    loaded from --model_name); `kind`: the model's kind (model/kind.py)."""
    if cfg.engine == "ctranslate2":
        return _ct2_class(kind).load(cfg, tokenizer=tokenizer, model_config=model_config,
                                     generation_config=generation_config, device=device, env=env)
    from ..model.settings import load_model
    from .hf import HFEngine

    t0 = time.perf_counter()
    if model is None:
        model = load_model(cfg, device, kind)
    t1 = time.perf_counter()
    engine = HFEngine(model, tokenizer, generation_config, device, seed=cfg.seed, causal=kind == CAUSAL)
    # from_pretrained apart from the engine's own set-up (the beam-search shortcut's check that a
    # batch's rows are computed independently: engines/shrink.py): time_breakdown.startup_steps.
    engine.load_seconds = {"model_load": t1 - t0, "engine_setup": time.perf_counter() - t1}
    return engine


def _ct2_class(kind: str) -> Any:
    """CTranslate2's engine for the model's kind: the Generator's for a decoder-only model."""
    from . import ct2, ct2_generator

    return ct2_generator.GeneratorEngine if kind == CAUSAL else ct2.CT2Engine
