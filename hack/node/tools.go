//go:build tools

// Package tools pins the commands this module builds, so `go mod tidy` keeps go.sum whole.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
