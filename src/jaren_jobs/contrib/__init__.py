"""Integrations with frameworks: each lives in a package of its own, imported only by its users."""
