"""Triton's protos compiled for protobuf's C runtime (upb): the gRPC inference messages are parsed
and serialized here, in C, while betterproto2 (tritonactor._proto) serves every other method.
Regenerate with `python tritonactor/_proto_c/generate.py`."""
