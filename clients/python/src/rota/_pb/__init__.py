"""Stubs generated from rota/v1/rota.proto by scripts/generate_stubs.py; do not edit."""
