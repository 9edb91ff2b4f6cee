"""Seconds: the latency model, replay server, forced-length time replay and its fit."""
