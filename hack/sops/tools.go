//go:build tools

// Package tools pins the commands the tests build from this module (`sops` encrypts the test
// fixtures, `age-keygen` makes their keys), so `go mod tidy` keeps go.sum whole.  The runtime
// helper is cmd/stageset-sops.
package tools

import (
	_ "filippo.io/age/cmd/age-keygen"
	_ "github.com/getsops/sops/v3/cmd/sops"
)
