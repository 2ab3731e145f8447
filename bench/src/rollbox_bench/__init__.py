"""rollbox-bench: ``rollbox bench``, the synthetic SWE-style task source and fault
injection (``ChaosBackend``), beside core rather than inside it.

Installed with ``pip install rollbox``; it plugs into rollbox through the hook
specification like any other plugin (``rollbox_bench.plugin``): the ``bench`` command and
the ``synthetic`` task source.
"""
