"""Git sources: resolve refs, fetch into shared mirrors, read trees. Knows nothing of Kubernetes."""
