"""Tests of the bench scripts (bench/*.py)."""
