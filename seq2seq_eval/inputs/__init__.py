"""The inputs: examples with ids from text files, JSON Lines or a Hugging Face dataset
(`read.iter_examples`), converted once into a memory-mapped Arrow store (`store`), and the sources
tokenized once into memory-mapped shards (`tokens`)."""
