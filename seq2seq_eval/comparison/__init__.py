"""Comparing systems (`seq2seq_eval compare`): paired significance tests (paired), every system
against the baseline (systems), earlier runs as systems (runs), the table (table), the HTML
report (details, html), and the subcommand (command)."""
