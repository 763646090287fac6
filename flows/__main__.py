"""``python -m flows`` = ``python -m flows.evaluate``."""
from flows.evaluate import main

main()
