"""seq2seq_eval: sharded, resumable generation evaluation for Hugging Face seq2seq models."""

__version__ = "0.1.0"
