"""The descriptor pool of the generated `*_pb2` modules: their own, so that they never clash with
another copy of Triton's protos in protobuf's default pool (tritonclient's `service_pb2`)."""

from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()
