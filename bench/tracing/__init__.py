"""`python -m bench tracing` (`__main__`, its settings in `config`): what OpenTelemetry tracing costs the
fleet, and one relayed request's timeline (`timeline`), from spans an OTLP receiver keeps (`otlp`)."""
