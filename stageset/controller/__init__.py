"""The controller: watches, a work queue, and the StageSet and GitRepository reconcilers."""
