"""Which columns of a dataset hold the sources, references and ids: the flags' dotted paths
(`translation.en`), or the layouts recognised without them (CNN/DailyMail, XSum, plain
source/target, WMT's translation dict keyed by --src_lang/--tgt_lang)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..config import EvalConfig
from ..errors import DataError

LAYOUTS = (("article", "highlights"), ("document", "summary"), ("source", "target"))

"""(source, target) column pairs recognised when no column is named: CNN/DailyMail, XSum, plain."""


TRANSLATION_COLUMN = "translation"

"""The WMT layout's column: one dict per row, keyed by language code."""


def column_paths(features: Mapping[str, Any]) -> list[str]:
    """Every column, plus `col.key` for each key of a nested dict column (recursively)."""
    paths: list[str] = []

    def walk(prefix: str, feature: Any) -> None:
        paths.append(prefix)
        for key, sub in _nested(feature).items():
            walk(f"{prefix}.{key}", sub)

    for name, feature in features.items():
        walk(name, feature)
    return paths


def _nested(feature: Any) -> dict[str, Any]:
    """The keys of a dict-valued feature: a struct, or a datasets.Translation of languages."""
    if isinstance(feature, Mapping):
        return dict(feature)
    languages = getattr(feature, "languages", None)
    if type(feature).__name__ == "Translation" and languages:
        return {lang: None for lang in languages}
    return {}


def _has_path(features: Mapping[str, Any], path: str) -> bool:
    return path in features or path in column_paths(features)


def resolve_columns(
    features: Mapping[str, Any], cfg: EvalConfig, where: str, need_targets: bool = True
) -> tuple[str, str | tuple[str, ...] | None]:
    """(source path, target path(s) or None). Named columns must exist; a recognised layout fills in
    the others. A defaulted target that is absent is None: the caller raises if it needs one.
    Several --target_column give a tuple of paths."""
    named_targets = cfg.target_column if isinstance(cfg.target_column, tuple) else (cfg.target_column,)
    for flag, path in (("--source_column", cfg.source_column), *(("--target_column", t) for t in named_targets),
                       ("--id_column", cfg.id_column)):
        if path is not None and not _has_path(features, path):
            raise DataError(f"{where}: no column {path!r} ({flag}); columns: {', '.join(column_paths(features))}")
    src = cfg.source_column or default_source(features, cfg, where)
    tgt = cfg.target_column or default_target(features, cfg, where, src, need_targets)
    return src, tgt


def reference_paths(features: Mapping[str, Any], source: str, targets: Sequence[str]) -> tuple[str, ...]:
    """The columns that hold references: the target columns and, when the source is a language
    of the translation dict, the dict's other languages (each a translation of the source, a
    reference whether or not this run scores against it)."""
    prefix = f"{TRANSLATION_COLUMN}."
    others = [f"{prefix}{lang}" for lang in _languages(features)] if source.startswith(prefix) else []
    return tuple(dict.fromkeys([*targets, *(p for p in others if p != source)]))


def _languages(features: Mapping[str, Any]) -> list[str]:
    return list(_nested(features[TRANSLATION_COLUMN])) if TRANSLATION_COLUMN in features else []


def default_source(features: Mapping[str, Any], cfg: EvalConfig, where: str) -> str:
    languages = _languages(features)
    if languages:
        if cfg.src_lang is None:
            raise DataError(
                f"{where}: column {TRANSLATION_COLUMN!r} holds languages {', '.join(languages)}; pass "
                f"--source_column {TRANSLATION_COLUMN}.<lang> and --target_column {TRANSLATION_COLUMN}.<lang> "
                "(or --src_lang and --tgt_lang)"
            )
        return f"{TRANSLATION_COLUMN}.{_language_key(cfg.src_lang, languages, '--src_lang', where)}"
    for src, _ in LAYOUTS:
        if src in features:
            return src
    raise DataError(
        f"{where}: no known source column (tried {', '.join(s for s, _ in LAYOUTS)}, {TRANSLATION_COLUMN}); "
        f"pass --source_column and --target_column; columns: {', '.join(column_paths(features))}"
    )


def default_target(
    features: Mapping[str, Any], cfg: EvalConfig, where: str, source: str, need_targets: bool
) -> str | None:
    """The target that goes with `source`: the other language of a translation dict, the partner
    of a recognised source column, else the first recognised target column present."""
    languages = _languages(features)
    if languages and source.startswith(f"{TRANSLATION_COLUMN}."):
        if cfg.tgt_lang is None:
            if not need_targets:
                return None
            raise DataError(
                f"{where}: column {TRANSLATION_COLUMN!r} holds languages {', '.join(languages)}; "
                f"pass --target_column {TRANSLATION_COLUMN}.<lang> (or --tgt_lang)"
            )
        return f"{TRANSLATION_COLUMN}.{_language_key(cfg.tgt_lang, languages, '--tgt_lang', where)}"
    partner = dict(LAYOUTS).get(source)
    if partner is not None and partner in features:
        return partner
    for _, tgt in LAYOUTS:
        if tgt in features:
            return tgt
    return partner


def _language_key(code: str, languages: Sequence[str], flag: str, where: str) -> str:
    """The translation dict's key for a tokenizer language code: exact, else its language part
    (mBART-50's en_XX and NLLB's eng_Latn name WMT's "en" and "eng")."""
    if code in languages:
        return code
    base = code.replace("-", "_").split("_")[0].lower()
    if base in languages:
        return base
    raise DataError(
        f"{where}: {flag} {code} is not a language of column {TRANSLATION_COLUMN!r} "
        f"(it holds {', '.join(languages)}); pass --source_column/--target_column {TRANSLATION_COLUMN}.<lang>"
    )
