"""A miniature of the 2.2.1 Model Zoo's ``run.py``: its package is ``cerebras.minizoo``, a portion
of the ``cerebras`` namespace beside csrun's legacy shim (as the zoo's ``cerebras.modelzoo`` is).

    python run.py {CPU,CSX} MODEL_DIR STEPS [train|eval] [--no-clip]
"""

import os
import sys

sys.path.append(os.path.dirname(os.path.abspath(__file__)))  # as the zoo's run.py appends src/

from cerebras.minizoo.flow import main  # noqa: E402

if __name__ == "__main__":
    main(sys.argv[1:])
