"""Simulated users and the personalization benchmark (`clawproxy simulate`).

Light at import time: torch, sentence-transformers and matplotlib load only when used.
"""
