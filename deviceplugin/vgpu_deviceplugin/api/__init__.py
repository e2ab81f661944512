"""kubelet device plugin API v1beta1: the project's .proto and its generated stubs (make proto)."""
