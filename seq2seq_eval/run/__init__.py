"""The run: the batch plan, process placement, the temp dir (manifest, journals, claims, rank files),
one rank's loop with its out-of-memory splitting, and rank 0's tail (wait, merge, score, write)."""
