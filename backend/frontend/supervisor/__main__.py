"""python -m backend.frontend.supervisor: the server (cli.py)."""
import sys

from .cli import main

sys.exit(main())
