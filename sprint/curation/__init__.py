"""Stages 1-3: component separation, DAG creation (online and batch), packing into trajectories."""
