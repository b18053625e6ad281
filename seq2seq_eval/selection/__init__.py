"""Quality-aware selection: one of an example's N candidates chosen by a metric (minimum Bayes
risk with a sacrebleu utility), over candidates made elsewhere or by a pseudolabel run
(`python -m seq2seq_eval select`, docs/selection.md): `mbr` (pure: the utility matrix, the
expected utilities, the choice), `candidates` (the candidates file, checked before any work),
`base` (the Selector interface), `selectors` (the registry of selections: one Selector per mode and metric), `command` (the
subcommand)."""
