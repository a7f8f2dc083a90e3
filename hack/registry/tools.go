//go:build tools

// Package tools pins the command this module builds, so `go mod tidy` keeps go.sum whole.
package tools

import _ "github.com/distribution/distribution/v3/cmd/registry"
