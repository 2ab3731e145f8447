"""rollbox's tools beside core: the commands ``rollbox run`` (one command in a fresh
sandbox, wired to this terminal) and ``rollbox doctor`` (can a backend run here, and how
to fix what stops it), and the metrics exporters (``rollbox_tools.metrics_export``:
Prometheus and OpenTelemetry observers of pools and runs). Core holds the contract; these
use it like any plugin."""
