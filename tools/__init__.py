"""Maintainer tools (not part of the course's `shared/` package)."""
