"""csrun: the legacy pipelined-mode workflow on any Slurm cluster, with a wafer emulator.

See README.md for the commands and ../DESIGN for the map of the code.
"""

__version__ = "0.1.0"
