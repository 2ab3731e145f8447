"""Helpers for testing OpenHands on rollbox without an LLM service."""
