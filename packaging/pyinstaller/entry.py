"""PyInstaller's entry script: the frozen app is the `dictation` command (no arguments = the tray app)."""

import multiprocessing
import sys

from dictation.cli import main

if __name__ == "__main__":
    multiprocessing.freeze_support()  # harmless where unused; needed if a dependency spawns processes on Windows
    sys.exit(main())
