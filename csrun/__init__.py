"""csrun: the legacy pipelined-mode workflow on any Slurm cluster, with a wafer emulator.

See README.md for the commands and ARCHITECTURE.md for the map of the code (the rooms, what
each may import, and the path of one batch).
"""

__version__ = "0.1.0"
