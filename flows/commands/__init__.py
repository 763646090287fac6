"""One module per `dagrag` command (flows.cli runs it as `python -m`)."""
