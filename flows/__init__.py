"""dagrag flows: one Prefect flow per command; method DAGs compose the stages in ``tasks``."""
import tasks  # noqa: F401  (sets the environment defaults before numpy, torch or Prefect load)
