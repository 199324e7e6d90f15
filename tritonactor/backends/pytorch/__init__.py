"""The PyTorch backend: TorchScript models (`pytorch_libtorch`), one module per instance.

torch is imported on first load, so a server without torch still starts. The backend and its
models, loading the module onto each instance's device, are in `backend`; the model parameters
it reads in `parameters`; how config names bind to `forward()` in `binding`; an instance's
execute path in `instance`.
"""

from __future__ import annotations

# The single module's constants, still importable from where they were.
from tritonactor.backends.pytorch.backend import MODEL_FILENAME as MODEL_FILENAME
from tritonactor.backends.pytorch.backend import PLATFORM as PLATFORM
from tritonactor.backends.pytorch.backend import PyTorchBackend, PyTorchModel
from tritonactor.backends.pytorch.instance import PyTorchInstance

__all__ = ["PyTorchBackend", "PyTorchInstance", "PyTorchModel"]
