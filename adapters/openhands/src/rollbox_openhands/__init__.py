"""OpenHands on rollbox sandboxes: the Runtime API, warm agent-servers, RollboxWorkspace."""
