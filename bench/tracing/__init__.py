"""`python -m bench tracing`: what OpenTelemetry tracing costs the fleet, and one relayed request's timeline.

- `bench.tracing.__main__`: the command;
- `bench.tracing.config`: its settings and why they are what they are;
- `bench.tracing.run`: the fleets, the measurement of each setting, the run's record;
- `bench.tracing.overhead`: each setting's figures, their ratios against tracing off, report.md;
- `bench.tracing.timeline`: picking a relayed trace and drawing it (timeline.png);
- `bench.tracing.otlp`: the OTLP/gRPC receiver the services export to, in a process of its own.
"""
