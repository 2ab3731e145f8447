"""Registers the local backend with rollbox (entry point group ``rollbox``)."""
