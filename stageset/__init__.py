"""stageset: staged GitOps for Kubernetes, applied as the tenant."""
