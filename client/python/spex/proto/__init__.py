"""spex.v1 protobuf messages and gRPC stubs, generated at build time from proto/spex.proto
(spex_pb2, spex_pb2_grpc)."""
