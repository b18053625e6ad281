"""evaluate()'s ranks agree before any work, and fail together with the real reason.

Every rank of the group checks in on the job's store with its resolved settings and what it holds
(`what_ranks_run`: its model's weights, its tokenizer's content, its effective generation
settings); each rank then compares every rank's with rank 0's, so a rank passed other arguments
(another eos_token_id, another n_obs) or other objects (noised weights, a model whose
generation_config differs, another model_max_length) stops every rank with one message naming
the fields, instead of mixing both into one result. A rank that never calls evaluate() is named after
--sync_timeout. Once the run is under way, a rank that fails publishes its error on the store
before it leaves, and the others raise that error (not the "Connection reset by peer" or
timeout their own collectives see when it is gone).

The command line needs none of this: its ranks parse one command line, and torchrun stops the
whole job when one of them dies.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping
from typing import Any

from ..errors import EvalError, RanksDisagree, RunFailed, SyncTimeoutError, as_error

_calls: dict[tuple[int, ...], int] = {}
"""evaluate() calls so far per group (its global ranks): every rank of a group counts the same
calls, so call k's keys on the store are new and the same on every rank."""

POLL_S = 0.05
"""How often a rank looks whether the others have checked in: check() does not block, so the
missing ranks can be named when the wait ends."""

_GO, _ABANDONED = b"go", b"abandoned"
_ERROR = "\0error"  # not a setting's name: a rank's refused arguments


def settings_of(cfg: Any, extra: Mapping[str, Any]) -> dict[str, str]:
    """What must be the same on every rank, by name: the resolved config's fields, each generate
    option by its own name, and `extra` (digests of in-memory data, the model's type). Values
    are JSON texts, so two ranks compare them exactly."""
    values = cfg.to_dict()
    gen = values.pop("generate_kwargs")
    out = {k: json.dumps(v, sort_keys=True, default=str) for k, v in values.items()}
    out.update({k: json.dumps(v, sort_keys=True, default=str) for k, v in gen.items()})
    out.update({k: json.dumps(v, sort_keys=True, default=str) for k, v in extra.items()})
    return out


def what_ranks_run(cfg: Any, model: Any = None, tokenizer: Any = None) -> dict[str, Any]:
    """What this rank would generate with, by name, beyond its arguments: the effective
    generation settings field by field (`generation.top_k`: what generate() would use, the model
    object's own generation_config included), the tokenizer's content (`tokenizer.vocab_sha256`,
    `tokenizer.model_max_length`, ...) and, for a model object, its weights (`weights`: every byte,
    model/fingerprint.py). Two ranks passed the same arguments but different objects differ here."""
    from ..model.fingerprint import tokenizer_fingerprint, weights_fingerprint
    from ..model.generation import full_dict
    from ..model.settings import generation_config_for, load_model_config, load_tokenizer, model_config_of

    model_config, base = model_config_of(model, cfg.model_name) if model is not None else load_model_config(cfg)
    tokenizer = load_tokenizer(cfg, tokenizer)
    held: dict[str, Any] = {f"generation.{k}": v for k, v in
                            full_dict(generation_config_for(model_config, base, tokenizer, cfg)).items()}
    held.update({f"tokenizer.{k}": v for k, v in tokenizer_fingerprint(tokenizer).items()})
    if model is not None:
        held["weights"] = weights_fingerprint(model)
    return held


def digest(value: Any) -> str:
    """A digest of in-memory inputs (sources, references, ids), compared in place of the texts."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode("utf-8")).hexdigest()


def differences(mine: Mapping[str, str], base: Mapping[str, str]) -> list[str]:
    """`name (base's value vs mine)` for every setting that differs; a setting one side lacks
    (a generate option given on one rank only) shows as "not given"."""
    out = []
    for key in sorted(set(mine) | set(base)):
        a, b = base.get(key), mine.get(key)
        if a != b:
            out.append(f"{key} ({'not given' if a is None else a} vs {'not given' if b is None else b})")
    return out


class Agreement:
    """One evaluate() call's keys on the job's store, for the ranks of `group_ranks`."""

    def __init__(self, store: Any, group_ranks: list[int], rank: int, timeout_s: float) -> None:
        import torch.distributed as tdist

        key = tuple(group_ranks)
        _calls[key] = _calls.get(key, 0) + 1
        prefix = f"seq2seq_eval/evaluate/{'_'.join(map(str, group_ranks))}/call_{_calls[key]}"
        self.store = tdist.PrefixStore(prefix, store)
        self.world_size = len(group_ranks)
        self.rank = rank
        self.timeout_s = timeout_s

    def check_in(self, settings: Mapping[str, str] | None, error: BaseException | None = None) -> None:
        """Publish this rank's settings, wait for every rank's (bounded by --sync_timeout), and
        raise on every rank the same error when any rank's differ from rank 0's. A rank whose
        arguments were refused publishes that error instead and returns (its caller raises
        it); the others raise it when they check in."""
        from ..errors import first_line

        store = self.store
        if error is not None:
            store.set(f"joined/{self.rank}", json.dumps({_ERROR: [type(error).__name__, first_line(error)]}))
            return
        store.set(f"joined/{self.rank}", json.dumps(settings, sort_keys=True))
        keys = [f"joined/{r}" for r in range(self.world_size)]
        deadline = time.monotonic() + self.timeout_s
        while True:
            missing = [r for r, k in enumerate(keys) if not store.check([k])]
            # Who decides is settled once, atomically: either every rank saw the others
            # ("go"), or one gave up first ("abandoned") and a rank arriving later must not
            # join a group the others have left.
            if not missing:
                verdict = store.compare_set("verdict", "", _GO)
            elif time.monotonic() >= deadline:
                verdict = store.compare_set("verdict", "", _ABANDONED + b" " + ",".join(map(str, missing)).encode())
            else:
                time.sleep(POLL_S)
                continue
            break
        if verdict != _GO:
            named = verdict.decode().split(" ", 1)[1] if b" " in verdict else "?"
            raise SyncTimeoutError(
                f"rank(s) {named.replace(',', ', ')} of {self.world_size} never called evaluate() within "
                f"--sync_timeout {self.timeout_s:g} s; every rank of the group must call evaluate(), with the "
                "same arguments, or raise sync_timeout")
        joined = [json.loads(store.get(k)) for k in keys]
        for r, entry in enumerate(joined):
            if _ERROR in entry:
                raise as_error(r, *entry[_ERROR])
        for r in range(1, self.world_size):
            diff = differences(joined[r], joined[0])
            if diff:
                raise RanksDisagree(f"rank {r} differs from rank 0 in {'; '.join(diff)}; "
                                    "expected the same settings, model and tokenizer on every rank")

    def publish(self, error: BaseException) -> None:
        """This rank failed: say why, for the ranks that will see it only as a lost peer."""
        from ..errors import first_line

        try:
            self.store.set(f"error/{self.rank}", json.dumps([type(error).__name__, first_line(error)]))
        except Exception:  # the store is gone with the job: the others see their own error
            pass

    def peer_error(self) -> EvalError | None:
        """The error of the lowest other rank that published one, as this rank raises it."""
        for r in range(self.world_size):
            if r == self.rank:
                continue
            try:
                if not self.store.check([f"error/{r}"]):
                    continue
                kind, text = json.loads(self.store.get(f"error/{r}"))
            except Exception:
                return None
            return as_error(r, kind, text)
        return None

    def raise_if_peer_failed(self) -> None:
        """For waits that would otherwise last --sync_timeout (rank 0 waiting for rank files)."""
        error = self.peer_error()
        if error is not None:
            raise error
