"""What the model brings to a run: its config and tokenizer, its task settings and the generation
config a run uses, and already converted CTranslate2 folders."""
