"""A real, local Kubernetes control plane (etcd + kube-apiserver) for tests and demos.

Why a real one: server-side apply ownership, RBAC through impersonation, CRD
establishment and CEL admission only exist inside a real kube-apiserver, so the
project tests against one rather than against mocks.  The binaries are built
from the Go module proxy (:mod:`stageset.envtest.build`) and started on loopback
with throw-away certificates (:mod:`stageset.envtest.server`).
"""
