"""dagrag stages: pure algorithms plus thin Prefect tasks around them.

Environment defaults are set here, before anything imports Prefect, sentence-transformers or
transformers: no network exists, so nothing may try a hub or send analytics.

OPENBLAS_NUM_THREADS=1: numpy's OpenBLAS threads keep spinning after a matrix product and starve
torch's OpenMP threads on 2 cores (measured: a one-question MiniLM encode right after a numpy
product took 36 ms instead of 11 ms). torch does the heavy lifting; numpy runs single-threaded.

HF_HUB_DISABLE_PROGRESS_BARS=1: transformers draws a "Loading weights" bar for a load that takes no
time; the encoder logs its own load line instead (:func:`tasks.text.encoder.load_encoder`).

PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW=ignore: the ``dagrag`` logger also logs to the API (so a run's stage
lines show in the UI); a line logged outside a flow run (``dagrag growth`` copying a store between its child
commands) is for the console only, not a reason for Prefect's "without a flow run id" warning.

The warnings filter silences torch's "TF32 acceleration on top of oneDNN" UserWarning, which every
``torch.backends.mkldnn.flags`` block (:func:`tasks.text.embed.encode`) raises on a CPU-only build.
"""
import os
import warnings

for _key, _value in {
    "OPENBLAS_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "60",
    "PREFECT_TASKS_DEFAULT_NO_CACHE": "true",
    "PREFECT_LOGGING_EXTRA_LOGGERS": "dagrag",
    "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore",
    "PREFECT_UI_ENABLED": "false",
}.items():
    os.environ.setdefault(_key, _value)

warnings.filterwarnings("ignore", message="TF32 acceleration on top of oneDNN", category=UserWarning)
