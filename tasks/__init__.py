"""dagrag stages: pure algorithms plus thin Prefect tasks around them.

Environment defaults are set here, before anything imports Prefect, sentence-transformers or
transformers: no network exists, so nothing may try a hub or send analytics.
"""
import os

for _key, _value in {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "60",
    "PREFECT_TASKS_DEFAULT_NO_CACHE": "true",
    "PREFECT_LOGGING_EXTRA_LOGGERS": "dagrag",
    "PREFECT_UI_ENABLED": "false",
}.items():
    os.environ.setdefault(_key, _value)
