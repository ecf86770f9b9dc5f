"""The tenant gRPC front (maas.v1.Gateway): its fields in, CompletionChunks out."""
