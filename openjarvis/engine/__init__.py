"""Inference engines behind one narrow interface (``base.Engine``) and the speculator above it."""
