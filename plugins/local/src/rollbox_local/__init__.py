"""rollbox's local backend: bubblewrap sandboxes on this machine."""
