"""Shared rigs for tests and bench scripts: real processes and servers on loopback."""
