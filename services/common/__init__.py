"""Plumbing shared by every RelayGR service: configuration, server bootstrap, metrics, validation."""
