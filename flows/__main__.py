"""``python -m flows COMMAND [overrides]`` = ``dagrag COMMAND [overrides]``; with no command it evaluates
(``python -m flows method=bm25`` = ``python -m flows.commands.evaluate method=bm25``)."""
import sys

from flows.cli import main

sys.exit(main(default="evaluate"))
