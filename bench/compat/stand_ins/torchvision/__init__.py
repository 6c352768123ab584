"""A small stand-in for the parts of torchvision the Model Zoo's fc_mnist uses (``datasets.MNIST``
reading IDX files, ``transforms``). torchvision's PyPI wheel does not load against the CPU torch
this project pins; the zoo's check puts this folder on the path. It is the user's dependency,
not csrun's, and is used by ``bench/compat/modelzoo.py`` only. Names the 2.x zoo imports for
other models import and raise when used (:mod:`torchvision._absent`)."""

import sys

from torchvision import _absent, datasets, transforms  # noqa: F401

_absent.install()
_absent.open_module(sys.modules[__name__])
_absent.open_module(datasets)
_absent.open_module(transforms)
