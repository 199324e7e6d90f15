"""`import triton_python_backend_utils` for a process a model starts itself (multiprocessing's
spawn re-imports model.py, which imports the helpers by their Triton name): the model's process
puts this folder last on `sys.path`, as Triton's stub puts its backend folder, and this module
is then the package's own helpers. (The model's process itself has them in `sys.modules`
already.) This folder holds nothing else, so that no module of ours shadows a model's."""

import sys

from tritonactor.backends.python import triton_python_backend_utils as _helpers

sys.modules[__name__] = _helpers
