"""The batch budget of a run, and what the run says of it: --bs or --max_tokens as given, the
budget of the run being resumed, or the device's default, the same at any world size; lowered for
the world size only with --budget_for_world_size (plan.default_plan), which the run then records
and says, as it says when ranks idle."""

from __future__ import annotations

from typing import Any

from ..config import EvalConfig
from ..model.kind import CAUSAL, SEQ2SEQ
from .plan import Plan, batch_budget, default_plan, make_batches


BY_WORLD_SIZE = "--budget_for_world_size"
"""How the provenance names a default budget lowered for the world size (plan.default_plan)."""


def choose_budget(cfg: EvalConfig, lengths: Any, world_size: int, device_type: str, cost: dict[str, Any],
                  recorded: tuple[int | None, int | None] | None, kind: str = SEQ2SEQ
                  ) -> tuple[Plan, int | None, int | None, dict[str, Any]]:
    """The batches, their budget (bs, max_tokens) and how it was chosen: --bs or --max_tokens as
    given; else, resuming, the budget the earlier run recorded (its batches are the journals');
    else the default for the engine, the device, the precision and the model's kind
    (plan.batch_budget), never for the world size, so that the outputs are the same bytes at any
    (a small set on many ranks may leave some idle: seconds); with --budget_for_world_size, that
    default lowered for the world size (plan.default_plan)."""
    if cfg.bs is None and cfg.max_tokens is None and recorded is not None:
        bs, max_tokens = recorded
        how: dict[str, Any] = {"from": "resumed"}
    else:
        bs, max_tokens = batch_budget(cfg.bs, cfg.max_tokens, device_type, cfg.engine, half=cfg.fp16 or cfg.bf16,
                                      causal=kind == CAUSAL, beams=cost["beams"])
        if cfg.bs is None and cfg.max_tokens is None:
            default = max_tokens
            if cfg.budget_for_world_size:
                max_tokens, plan = default_plan(lengths, world_size, default, **cost)  # type: ignore[arg-type]
                return plan, None, max_tokens, {"from": BY_WORLD_SIZE, "device_default": default,
                                                "world_size": world_size}
            how = {"from": "default", "device_default": default}
        else:
            how = {"from": "--max_tokens" if cfg.max_tokens is not None else "--bs"}
    return make_batches(lengths, bs=bs, max_tokens=max_tokens, **cost), bs, max_tokens, how


def _flag(prep: Any) -> str:
    plan = prep.manifest["plan"]
    return f"--bs {plan['bs']}" if plan["bs"] is not None else f"--max_tokens {plan['max_tokens']}"


def describe_budget(prep: Any) -> str:
    """The budget and where it came from, as the dry run prints it."""
    plan, how, flag = prep.manifest["plan"], prep.budget, _flag(prep)
    if how.get("from") == "resumed":
        return f"{flag}: the budget of the run being resumed"
    if how.get("from") == "default":
        return f"{flag}: the device's default"
    if how.get("from") != BY_WORLD_SIZE:
        return flag
    if plan["max_tokens"] == how["device_default"]:
        return f"{flag}: the device's default, kept by {BY_WORLD_SIZE} for {how['world_size']} ranks"
    return (f"{flag}: lowered by {BY_WORLD_SIZE} for {how['world_size']} ranks from the device's "
            f"{how['device_default']}; give {flag} to get these batches at any world size")


def layout_warning(prep: Any) -> str | None:
    """One line when the budget in force depends on the world size (--budget_for_world_size
    lowered it), so that the outputs' last bits may differ at another world size; else None."""
    how = prep.budget
    if how.get("from") != BY_WORLD_SIZE or prep.manifest["plan"]["max_tokens"] == how["device_default"]:
        return None
    flag = _flag(prep)
    return (f"{BY_WORLD_SIZE}: {flag} for {how['world_size']} ranks (the device's default is "
            f"{how['device_default']}): beam scores and near ties may differ in their last bits at another world "
            f"size; give {flag} for these bytes at any")


def idle_ranks_warning(prep: Any, world_size: int) -> str | None:
    """One line when some rank would get no batch, else None. The deal gives the costliest
    batches to distinct ranks first, so with fewer batches than ranks the rest idle."""
    idle = world_size - min(len(prep.batches), world_size)
    if not idle:
        return None
    source = prep.budget.get("from")
    if len(prep.store) < world_size and source in ("default", BY_WORLD_SIZE):
        fix = f"the set has only {len(prep.store)} examples; run it on fewer ranks"
    elif source == "default":
        # Idle ranks cost seconds on a small set; a budget for the world size costs bytes that
        # follow the world size: the user's choice, never the default's.
        fix = (f"run it on fewer ranks, or give {BY_WORLD_SIZE} to cut it finer (outputs then depend on the world "
               "size in their last bits)")
    elif source == "resumed":
        fix = "the budget of the run being resumed, whose journals hold these batches"
    else:
        fix = f"give a smaller budget, or neither --bs nor --max_tokens with {BY_WORLD_SIZE} for one that keeps every rank busy"
    return f"{idle} of {world_size} ranks get no batch ({len(prep.batches)} batches at {_flag(prep)}); {fix}"
