"""tritonactor: a Triton-compatible inference server on anyio actors."""

__version__ = "0.1.0"
