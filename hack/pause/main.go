// Command pause is the pod sandbox's only process for the test node (stageset.envtest.node): it
// holds the pod's namespaces open, reaps orphaned children (it is PID 1 when the pod shares its
// process namespace) and exits cleanly on SIGINT or SIGTERM.  Built with CGO_ENABLED=0 into a
// one-file OCI image, so the test node needs no registry for its sandbox image.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for received := range signals {
		if received != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
