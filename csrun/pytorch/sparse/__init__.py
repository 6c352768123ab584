"""``cstorch.sparse``: weight sparsity, which csrun's device does not run.

The names import (the Model Zoo's config classes reference them); using one raises one line:
remove the ``sparsity`` section of the params.
"""

from __future__ import annotations

from csrun.torch.r1.unsupported import unsupported, unsupported_class

_WHY = "csrun's device trains dense weights; remove the params' `sparsity` section"

configure = unsupported("cerebras.pytorch.sparse.configure", _WHY)
map_sparsity_algorithm = unsupported("cerebras.pytorch.sparse.map_sparsity_algorithm", _WHY)
SparsityAlgorithm = unsupported_class("cerebras.pytorch.sparse.SparsityAlgorithm", _WHY)

__all__ = ["configure", "map_sparsity_algorithm", "SparsityAlgorithm"]
