"""The headline block experiment."""
