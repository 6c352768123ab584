"""A small stand-in for the parts of torchvision the R1.6 zoo's fc_mnist uses (``datasets.MNIST``
reading IDX files, ``transforms``). torchvision's PyPI wheel does not load against the CPU torch
this project pins; the zoo's check puts this folder on the path. It is the user's dependency,
not csrun's, and is used by ``bench/compat/modelzoo.py`` only."""

from torchvision import datasets, transforms  # noqa: F401
