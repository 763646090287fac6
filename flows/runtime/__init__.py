"""What every command runs on: the typed config, checks before heavy work, the Prefect server and task runners, run bookkeeping."""
