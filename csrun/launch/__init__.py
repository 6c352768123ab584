"""Launching jobs: srun lines, the no-Slurm fallback, batch submission and container wrapping."""
