"""The model-zoo runner: run.py flags, params, loops, checkpoints, summaries, progress."""
