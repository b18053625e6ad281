"""Scoring: pure functions over lists of strings. Each metric in two steps (per-example statistics on
the rank that generated the example, their combination on rank 0), equal to scoring every string
in one place: BLEU (bleu), ROUGE (rouge), sacrebleu's chrF/chrF++/TER (sacre), several at once
(totals), the task's own metric (task), metric names (names)."""
