"""Shared memory, system and CUDA: the regions clients register (`registry`), what one region
is (`region`, `system`, `cuda`), and what one request holds of them (`lease`)."""
