"""`python -m bench.tracing`: what OpenTelemetry tracing costs the fleet, and one relayed request's timeline.

- `bench.tracing.__main__`: the command (settings, fleets, measurement, results);
- `bench.tracing.overhead`: each setting's figures, their ratios against tracing off, report.md;
- `bench.tracing.timeline`: picking a relayed trace and drawing it (timeline.png).
"""
